//! `xfabric`: command-line access to xfabric. `xfabric info` lists providers and what they
//! offer in the layouts of libfabric's `fi_info`, so the two tools' output can be compared line
//! by line.

use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::process::ExitCode;

use xfabric::{
    addr_format_str, caps_str, fi_version, mode_str, mr_mode_str, order_str, protocol_str, EpType,
    Info, FI_ADDR_STR, FI_MAJOR_VERSION, FI_MINOR_VERSION, FI_ORDER_NONE, FI_ORDER_STRICT,
};

const USAGE: &str = "\
Usage: xfabric <command> [options]

Commands:
  info            list providers and their attributes, like fi_info

Options:
  -h, --help      display this help and exit
  --version       print version info and exit

Run 'xfabric info --help' for the options of info.
";

const INFO_USAGE: &str = "\
Usage: xfabric info [-p PROV] [-v] [-c CAPS] [-t EP_TYPE] [-l] [--hmem]
  -h, --help                  display this help and exit
  -p, --provider=PROV         specify provider explicitly (PROV1;PROV2 for several)
  -c, --caps=CAP1|CAP2..      one or more capabilities: FI_MSG|FI_TAGGED...
  -t, --ep_type=EPTYPE        specify single endpoint type: FI_EP_MSG, FI_EP_RDM...
  -l, --list                  list available providers
  -v, --verbose               verbose output (ends with the heterogeneous-memory report)
  --hmem                      heterogeneous-memory interfaces: available with their devices,
                              or why not
";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        None => Err(Failure::Usage(
            "xfabric: a command is required".into(),
            USAGE.to_string(),
        )),
        Some("-h" | "--help" | "help") => Ok(USAGE.to_string()),
        Some("--version") => Ok(format!(
            "xfabric: {}\nlibfabric api: {FI_MAJOR_VERSION}.{FI_MINOR_VERSION}\n",
            env!("CARGO_PKG_VERSION")
        )),
        Some("info") => InfoArgs::parse(&args[1..]).and_then(|a| a.run()),
        Some(other) => Err(Failure::Usage(
            format!("xfabric: unknown command {other:?}"),
            USAGE.to_string(),
        )),
    };
    match result {
        Ok(text) => emit(&text),
        Err(Failure::Usage(why, usage)) => {
            eprint!("{why}\n\n{usage}");
            ExitCode::FAILURE
        }
        Err(Failure::Msg(why)) => {
            eprintln!("{why}");
            ExitCode::FAILURE
        }
    }
}

/// Why a command failed: a usage mistake (printed with the usage text) or a plain message.
#[derive(Debug)]
enum Failure {
    Usage(String, String),
    Msg(String),
}

/// Writes the command's output; a closed pipe (`xfabric info -v | head`) is not an error.
fn emit(text: &str) -> ExitCode {
    match io::stdout().lock().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xfabric: writing output: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The options of `xfabric info`, already turned into getinfo hints.
#[derive(Debug, Default)]
struct InfoArgs {
    help: bool,
    verbose: bool,
    list: bool,
    hmem: bool,
    hints: Info,
}

impl InfoArgs {
    /// getopt-style: `-p shm`, `-pshm`, `--provider shm`, `--provider=shm`, `-vl`.
    fn parse(args: &[String]) -> Result<Self, Failure> {
        let usage =
            |why: String| Failure::Usage(format!("xfabric info: {why}"), INFO_USAGE.to_string());
        let mut out = InfoArgs::default();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let (opt, mut inline): (char, Option<String>) =
                if let Some(long) = arg.strip_prefix("--") {
                    let (name, val) = match long.split_once('=') {
                        Some((n, v)) => (n, Some(v.to_string())),
                        None => (long, None),
                    };
                    let opt = match name {
                        "help" => 'h',
                        "provider" => 'p',
                        "caps" => 'c',
                        "ep_type" => 't',
                        "list" => 'l',
                        "verbose" => 'v',
                        "hmem" => 'H',
                        _ => return Err(usage(format!("unknown option --{name}"))),
                    };
                    (opt, val)
                } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
                    // Flags may be bundled (`-vl`); an option taking a value ends the bundle.
                    let mut chars = short.chars();
                    let mut opt = chars.next().unwrap_or('-');
                    while matches!(opt, 'h' | 'l' | 'v') && !chars.as_str().is_empty() {
                        out.set_flag(opt);
                        opt = chars.next().unwrap_or('-');
                    }
                    let rest = chars.as_str();
                    (opt, (!rest.is_empty()).then(|| rest.to_string()))
                } else {
                    return Err(usage(format!("unexpected argument {arg:?}")));
                };
            match opt {
                'h' | 'l' | 'v' | 'H' => {
                    if inline.is_some() {
                        return Err(usage(format!("option {arg} takes no value")));
                    }
                    out.set_flag(opt);
                }
                'p' | 'c' | 't' => {
                    let val = match inline.take() {
                        Some(v) => v,
                        None => it
                            .next()
                            .cloned()
                            .ok_or_else(|| usage(format!("option {arg} needs a value")))?,
                    };
                    match opt {
                        'p' => out.hints.fabric_attr.prov_name = Some(val),
                        'c' => out.hints.caps = parse_caps(&val).map_err(Failure::Msg)?,
                        _ => {
                            out.hints.ep_attr.ep_type = parse_ep_type(&val).map_err(Failure::Msg)?
                        }
                    }
                }
                _ => return Err(usage(format!("unknown option {arg}"))),
            }
        }
        Ok(out)
    }

    fn set_flag(&mut self, opt: char) {
        match opt {
            'h' => self.help = true,
            'l' => self.list = true,
            'H' => self.hmem = true,
            _ => self.verbose = true,
        }
    }

    fn run(&self) -> Result<String, Failure> {
        if self.help {
            return Ok(INFO_USAGE.to_string());
        }
        if self.list {
            return Ok(provider_list_text());
        }
        if self.hmem {
            return Ok(hmem_report_text());
        }
        let version = fi_version(FI_MAJOR_VERSION, FI_MINOR_VERSION);
        let infos = xfabric::getinfo(version, None, None, 0, Some(&self.hints))
            .map_err(|e| Failure::Msg(format!("fi_getinfo: -{} ({e})", e.errno())))?;
        let mut out = String::new();
        for info in &infos {
            if self.verbose {
                write_verbose(&mut out, info);
            } else {
                write_short(&mut out, info);
            }
        }
        if self.verbose {
            out.push_str(&hmem_report_text());
        }
        Ok(out)
    }
}

/// Each heterogeneous-memory interface: available with its devices, or why not.
fn hmem_report_text() -> String {
    let mut out = String::from("hmem:\n");
    for line in xfabric::hmem::Hmem::global().report() {
        out.push_str(&format!("    {line}\n"));
    }
    out
}

/// `FI_MSG|FI_TAGGED` → the capability bits, naming the first word that is not a capability.
fn parse_caps(list: &str) -> Result<u64, String> {
    list.split('|').map(str::trim).try_fold(0, |caps, name| {
        xfabric::cap_from_str(name)
            .map(|bit| caps | bit)
            .ok_or_else(|| format!("xfabric info: unrecognized capability {name:?} in -c {list:?}"))
    })
}

fn parse_ep_type(name: &str) -> Result<EpType, String> {
    (0..=5)
        .filter_map(EpType::from_raw)
        .find(|t| t.c_name() == name)
        .ok_or_else(|| {
            format!(
                "xfabric info: unrecognized endpoint type {name:?} (FI_EP_MSG, FI_EP_DGRAM, FI_EP_RDM, ...)"
            )
        })
}

/// `fi_info -l`: each provider's name and version.
fn provider_list_text() -> String {
    let mut out = String::new();
    for p in xfabric::provider_list() {
        let _ = writeln!(
            out,
            "{}:\n    version: {}",
            p.name(),
            version_str(p.version())
        );
    }
    out
}

/// `FI_VERSION(major, minor)` as `major.minor`.
fn version_str(v: u32) -> String {
    format!("{}.{}", v >> 16, v & 0xffff)
}

fn name_or_null(name: &Option<String>) -> &str {
    name.as_deref().unwrap_or("(null)")
}

/// fi_info's list form of a flag word: `[ FI_MSG, FI_TAGGED ]`, `[  ]` when empty.
fn list(joined: String) -> String {
    format!("[ {} ]", joined.replace(" | ", ", "))
}

/// Completion order has its own names: nothing is `FI_ORDER_NONE`, every ordering `FI_ORDER_STRICT`.
fn comp_order_str(order: u64) -> String {
    if order == FI_ORDER_NONE {
        return "FI_ORDER_NONE".into();
    }
    let mut parts = Vec::new();
    let mut rest = order;
    if order & FI_ORDER_STRICT == FI_ORDER_STRICT {
        parts.push("FI_ORDER_STRICT".to_string());
        rest &= !FI_ORDER_STRICT;
    }
    if rest != 0 {
        parts.push(order_str(rest));
    }
    parts.join(" | ")
}

/// An address as fi_info shows it: the string for `FI_ADDR_STR`, otherwise its bytes in hex.
fn addr_str(format: u32, addr: &Option<Vec<u8>>) -> String {
    match addr {
        None => "(null)".into(),
        Some(a) if format == FI_ADDR_STR => String::from_utf8_lossy(a)
            .trim_end_matches('\0')
            .to_string(),
        Some(a) => a.iter().fold("0x".to_string(), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        }),
    }
}

fn key_len(key: &Option<Vec<u8>>) -> usize {
    key.as_ref().map_or(0, Vec::len)
}

/// fi_info's default layout.
fn write_short(out: &mut String, info: &Info) {
    let _ = write!(
        out,
        "provider: {}\n    fabric: {}\n    domain: {}\n    version: {}\n    type: {}\n    protocol: {}\n",
        info.provider(),
        name_or_null(&info.fabric_attr.name),
        name_or_null(&info.domain_attr.name),
        version_str(info.fabric_attr.prov_version),
        info.ep_attr.ep_type.c_name(),
        protocol_str(info.ep_attr.protocol),
    );
}

/// fi_info -v: the `fi_info:` tree, fields in `fi_tostr`'s order. Fields our `Info` does not
/// have (`handle`, `domain`, `nic`) print as the null values fi_info shows for a fresh info.
fn write_verbose(out: &mut String, i: &Info) {
    // A section heading is a key with an empty value, printed without the trailing space.
    let mut w = |indent: usize, key: &str, val: &dyn std::fmt::Display| {
        let val = val.to_string();
        let sep = if val.is_empty() { "" } else { " " };
        let _ = writeln!(out, "{:indent$}{key}:{sep}{val}", "", indent = indent * 4);
    };
    let (tx, rx, ep, dom, fab) = (
        &i.tx_attr,
        &i.rx_attr,
        &i.ep_attr,
        &i.domain_attr,
        &i.fabric_attr,
    );
    let addrlen = |a: &Option<Vec<u8>>| a.as_ref().map_or(0, Vec::len);
    let mr_mode = if dom.mr_mode == 0 {
        String::new()
    } else {
        mr_mode_str(dom.mr_mode)
    };

    w(0, "---\nfi_info", &"");
    w(1, "caps", &list(caps_str(i.caps)));
    w(1, "mode", &list(mode_str(i.mode)));
    w(1, "addr_format", &addr_format_str(i.addr_format));
    w(1, "src_addrlen", &addrlen(&i.src_addr));
    w(1, "dest_addrlen", &addrlen(&i.dest_addr));
    w(1, "src_addr", &addr_str(i.addr_format, &i.src_addr));
    w(1, "dest_addr", &addr_str(i.addr_format, &i.dest_addr));
    w(1, "handle", &"(nil)");

    w(1, "fi_tx_attr", &"");
    w(2, "caps", &list(caps_str(tx.caps)));
    w(2, "mode", &list(mode_str(tx.mode)));
    w(2, "op_flags", &list(caps_str(tx.op_flags)));
    w(2, "msg_order", &list(order_str(tx.msg_order)));
    w(2, "comp_order", &list(comp_order_str(tx.comp_order)));
    w(2, "inject_size", &tx.inject_size);
    w(2, "size", &tx.size);
    w(2, "iov_limit", &tx.iov_limit);
    w(2, "rma_iov_limit", &tx.rma_iov_limit);
    w(2, "tclass", &format_args!("{:#x}", tx.tclass));

    w(1, "fi_rx_attr", &"");
    w(2, "caps", &list(caps_str(rx.caps)));
    w(2, "mode", &list(mode_str(rx.mode)));
    w(2, "op_flags", &list(caps_str(rx.op_flags)));
    w(2, "msg_order", &list(order_str(rx.msg_order)));
    w(2, "comp_order", &list(comp_order_str(rx.comp_order)));
    w(2, "total_buffered_recv", &rx.total_buffered_recv);
    w(2, "size", &rx.size);
    w(2, "iov_limit", &rx.iov_limit);

    w(1, "fi_ep_attr", &"");
    w(2, "type", &ep.ep_type.c_name());
    w(2, "protocol", &protocol_str(ep.protocol));
    w(2, "protocol_version", &ep.protocol_version);
    w(2, "max_msg_size", &ep.max_msg_size);
    w(2, "msg_prefix_size", &ep.msg_prefix_size);
    w(2, "max_order_raw_size", &ep.max_order_raw_size);
    w(2, "max_order_war_size", &ep.max_order_war_size);
    w(2, "max_order_waw_size", &ep.max_order_waw_size);
    w(
        2,
        "mem_tag_format",
        &format_args!("{:#018x}", ep.mem_tag_format),
    );
    w(2, "tx_ctx_cnt", &ep.tx_ctx_cnt);
    w(2, "rx_ctx_cnt", &ep.rx_ctx_cnt);
    w(2, "auth_key_size", &key_len(&ep.auth_key));

    w(1, "fi_domain_attr", &"");
    w(2, "domain", &"0x0");
    w(2, "name", &name_or_null(&dom.name));
    w(2, "threading", &dom.threading.c_name());
    w(2, "control_progress", &dom.control_progress.c_name());
    w(2, "data_progress", &dom.data_progress.c_name());
    w(2, "resource_mgmt", &dom.resource_mgmt.c_name());
    w(2, "av_type", &dom.av_type.c_name());
    w(2, "mr_mode", &list(mr_mode));
    w(2, "mr_key_size", &dom.mr_key_size);
    w(2, "cq_data_size", &dom.cq_data_size);
    w(2, "cq_cnt", &dom.cq_cnt);
    w(2, "ep_cnt", &dom.ep_cnt);
    w(2, "tx_ctx_cnt", &dom.tx_ctx_cnt);
    w(2, "rx_ctx_cnt", &dom.rx_ctx_cnt);
    w(2, "max_ep_tx_ctx", &dom.max_ep_tx_ctx);
    w(2, "max_ep_rx_ctx", &dom.max_ep_rx_ctx);
    w(2, "max_ep_stx_ctx", &dom.max_ep_stx_ctx);
    w(2, "max_ep_srx_ctx", &dom.max_ep_srx_ctx);
    w(2, "cntr_cnt", &dom.cntr_cnt);
    w(2, "mr_iov_limit", &dom.mr_iov_limit);
    w(2, "caps", &list(caps_str(dom.caps)));
    w(2, "mode", &list(mode_str(dom.mode)));
    w(2, "auth_key_size", &key_len(&dom.auth_key));
    w(2, "max_err_data", &dom.max_err_data);
    w(2, "mr_cnt", &dom.mr_cnt);
    w(2, "tclass", &format_args!("{:#x}", dom.tclass));

    w(1, "fi_fabric_attr", &"");
    w(2, "name", &name_or_null(&fab.name));
    w(2, "prov_name", &name_or_null(&fab.prov_name));
    w(2, "prov_version", &version_str(fab.prov_version));
    w(2, "api_version", &version_str(fab.api_version));
    w(1, "nic", &"(nil)");
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfabric::{FI_MSG, FI_ORDER_DATA, FI_ORDER_SAS, FI_TAGGED};

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn options_parse_getopt_style() {
        let a = InfoArgs::parse(&args(&[
            "-vpshm",
            "--caps=FI_MSG | FI_TAGGED",
            "-t",
            "FI_EP_RDM",
        ]))
        .unwrap();
        assert!(a.verbose && !a.list);
        assert_eq!(a.hints.fabric_attr.prov_name.as_deref(), Some("shm"));
        assert_eq!(a.hints.caps, FI_MSG | FI_TAGGED);
        assert_eq!(a.hints.ep_attr.ep_type, EpType::Rdm);
        assert!(matches!(
            InfoArgs::parse(&args(&["-p"])),
            Err(Failure::Usage(..))
        ));
        assert!(matches!(
            InfoArgs::parse(&args(&["-x"])),
            Err(Failure::Usage(..))
        ));
        assert!(matches!(
            InfoArgs::parse(&args(&["-v=1"])),
            Err(Failure::Usage(..))
        ));
        assert!(parse_caps("FI_MSG|").is_err());
        assert!(parse_ep_type("FI_EP_BOGUS").is_err());
    }

    #[test]
    fn values_print_as_fi_info_does() {
        assert_eq!(list(caps_str(FI_MSG | FI_TAGGED)), "[ FI_MSG, FI_TAGGED ]");
        assert_eq!(list(String::new()), "[  ]");
        assert_eq!(comp_order_str(0), "FI_ORDER_NONE");
        assert_eq!(
            comp_order_str(FI_ORDER_STRICT | FI_ORDER_DATA),
            "FI_ORDER_STRICT | FI_ORDER_DATA"
        );
        assert_eq!(comp_order_str(FI_ORDER_SAS), "FI_ORDER_SAS");
        assert_eq!(version_str(fi_version(1, 17)), "1.17");
        assert_eq!(
            addr_str(FI_ADDR_STR, &Some(b"fi_shm://7\0".to_vec())),
            "fi_shm://7"
        );
        assert_eq!(addr_str(1, &Some(vec![1, 0xab])), "0x01ab");
    }
}
