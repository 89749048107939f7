//! `xfabric`: command-line access to xfabric. `xfabric info` lists providers and what they
//! offer in the layouts of libfabric's `fi_info`, so the two tools' output can be compared line
//! by line.

use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::process::ExitCode;

use clap::error::ErrorKind;
use clap::{Parser, Subcommand};
use xfabric::settings::SETTINGS;
use xfabric::{
    addr_format_str, caps_str, fi_version, mode_str, mr_mode_str, order_str, protocol_str, EpType,
    Info, FI_ADDR_STR, FI_MAJOR_VERSION, FI_MINOR_VERSION, FI_ORDER_NONE, FI_ORDER_STRICT,
    FI_SOURCE,
};

/// Command-line access to xfabric.
#[derive(Parser, Debug)]
#[command(
    name = "xfabric",
    disable_version_flag = true,
    help_template = "{usage-heading} {usage}\n\n{about-with-newline}\n{all-args}{after-help}"
)]
struct Cli {
    /// Print version info and exit
    #[arg(long)]
    version: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// List providers and their attributes, like fi_info
    Info(InfoArgs),
}

/// fi_info's options, with its meanings.
#[derive(clap::Args, Debug, Default)]
#[command(
    disable_version_flag = true,
    help_template = "{usage-heading} {usage}\n\n{about-with-newline}\n{all-args}{after-help}",
    after_help = "FI_PROVIDER (PROV1,PROV2 or ^PROV1,PROV2 to exclude) limits the providers \
                  queried, as libfabric's does."
)]
struct InfoArgs {
    /// Source name or address (queried with FI_SOURCE)
    #[arg(short = 's', long = "src_addr", value_name = "ADDR")]
    src_addr: Option<String>,
    /// Dest node name or address
    #[arg(short = 'n', long = "node", value_name = "NAME")]
    node: Option<String>,
    /// Port number
    #[arg(short = 'P', long = "port", value_name = "PNUM")]
    port: Option<String>,
    /// One or more capabilities: FI_MSG|FI_RMA...
    #[arg(short = 'c', long = "caps", value_name = "CAP1|CAP2..", value_parser = parse_caps)]
    caps: Option<u64>,
    /// One or more modes, default all modes
    #[arg(short = 'm', long = "mode", value_name = "MOD1|MOD2..", value_parser = parse_mode)]
    mode: Option<u64>,
    /// Specify single endpoint type: FI_EP_MSG, FI_EP_DGRAM...
    #[arg(short = 't', long = "ep_type", value_name = "EPTYPE", value_parser = parse_ep_type)]
    ep_type: Option<EpType>,
    /// Specify the domain name
    #[arg(short = 'd', long = "domain", value_name = "DOMAIN")]
    domain: Option<String>,
    /// Specify the fabric name
    #[arg(short = 'f', long = "fabric", value_name = "FABRIC")]
    fabric: Option<String>,
    /// Specify accepted address format: FI_FORMAT_UNSPEC, FI_SOCKADDR...
    #[arg(short = 'a', long = "addr_format", value_name = "FMT", value_parser = parse_addr_format)]
    addr_format: Option<u32>,
    /// Specify provider explicitly (PROV1;PROV2 for several)
    #[arg(short = 'p', long = "provider", value_name = "PROV")]
    provider: Option<String>,
    /// Print xfabric environment variables
    #[arg(short = 'e', long = "env")]
    env: bool,
    /// Print xfabric environment variables with substr
    #[arg(short = 'g', long = "getenv", value_name = "SUBSTR", num_args = 0..=1, default_missing_value = "")]
    getenv: Option<String>,
    /// Print fi_info structures containing substr
    #[arg(short = 'i', long = "info", value_name = "SUBSTR")]
    info: Option<String>,
    /// List available providers
    #[arg(short = 'l', long = "list")]
    list: bool,
    /// Verbose output (ends with the heterogeneous-memory report)
    #[arg(short = 'v', long = "verbose")]
    verbose: bool,
    /// Heterogeneous-memory interfaces: available with their devices, or why not
    #[arg(long)]
    hmem: bool,
    /// Print version info and exit
    #[arg(long)]
    version: bool,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            return emit(&e.to_string());
        }
        Err(e) => {
            return fail(&format!(
                "{} (--help for usage)",
                first_line(&e.to_string())
            ))
        }
    };
    let result = match cli.command {
        _ if cli.version => Ok(version_text()),
        None => Err("a command is required (info; --help for usage)".to_string()),
        Some(Command::Info(a)) => a.run().map_err(|e| format!("info: {e}")),
    };
    match result {
        Ok(text) => emit(&text),
        Err(why) => fail(&why),
    }
}

/// clap's message without its "error: " prefix, usage block and hints.
fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("bad arguments");
    line.trim_start_matches("error: ").to_string()
}

/// One line on stderr, exit status 1: every failure, whatever its cause.
fn fail(why: &str) -> ExitCode {
    let one_line = why.replace('\n', "; ");
    eprintln!("xfabric: {one_line}");
    ExitCode::FAILURE
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

/// As `fi_info --version`: the tool, the library, the API it implements.
fn version_text() -> String {
    let v = env!("CARGO_PKG_VERSION");
    format!("xfabric: {v}\nlibxfabric: {v}\nlibfabric api: {FI_MAJOR_VERSION}.{FI_MINOR_VERSION}\n")
}

impl InfoArgs {
    fn hints(&self) -> Info {
        let mut hints = Info::default();
        hints.fabric_attr.prov_name = self.provider.clone();
        hints.fabric_attr.name = self.fabric.clone();
        hints.domain_attr.name = self.domain.clone();
        hints.caps = self.caps.unwrap_or(0);
        // fi_info accepts every mode unless told otherwise; 0 is "any" to getinfo.
        hints.mode = self.mode.unwrap_or(0);
        hints.addr_format = self.addr_format.unwrap_or(hints.addr_format);
        if let Some(t) = self.ep_type {
            hints.ep_attr.ep_type = t;
        }
        hints
    }

    fn run(&self) -> Result<String, String> {
        if self.version {
            return Ok(version_text());
        }
        if self.list {
            return Ok(provider_list_text());
        }
        if self.env || self.getenv.is_some() {
            return Ok(env_text(self.getenv.as_deref().unwrap_or("")));
        }
        if self.hmem {
            return Ok(hmem_report_text());
        }
        let allowed = ProviderFilter::from_env(xfabric::settings::FI_PROVIDER.text());
        // As fi_info: a source address is the node, looked up with FI_SOURCE.
        let (node, flags) = match (&self.src_addr, &self.node) {
            (Some(src), _) => (Some(src.as_str()), FI_SOURCE),
            (None, node) => (node.as_deref(), 0),
        };
        let version = fi_version(FI_MAJOR_VERSION, FI_MINOR_VERSION);
        let hints = self.hints();
        let infos = xfabric::getinfo(version, node, self.port.as_deref(), flags, Some(&hints))
            .map_err(|e| format!("fi_getinfo: -{} ({e})", e.errno()))?;
        let infos: Vec<&Info> = infos
            .iter()
            .filter(|i| allowed.admits(i.provider()))
            .collect();
        if infos.is_empty() {
            return Err(format!(
                "fi_getinfo: -{} (FI_PROVIDER={} leaves no provider)",
                libc::ENODATA,
                allowed.text
            ));
        }
        let verbose = self.verbose || self.info.is_some();
        let mut out = String::new();
        for info in infos {
            let mut one = String::new();
            if verbose {
                write_verbose(&mut one, info);
            } else {
                write_short(&mut one, info);
            }
            let wanted = self
                .info
                .as_deref()
                .is_none_or(|sub| one.to_lowercase().contains(&sub.to_lowercase()));
            if wanted {
                out.push_str(&one);
            }
        }
        if self.verbose {
            out.push_str(&hmem_report_text());
        }
        Ok(out)
    }
}

/// `FI_PROVIDER`: `a,b` admits only those providers, `^a,b` every provider but those.
#[derive(Debug, Default)]
struct ProviderFilter {
    text: String,
    names: Vec<String>,
    exclude: bool,
}

impl ProviderFilter {
    fn from_env(value: Option<&str>) -> Self {
        let Some(text) = value else {
            return Self::default();
        };
        let text = text.to_string();
        let (exclude, list) = match text.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, text.as_str()),
        };
        let names = list
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string)
            .collect();
        Self {
            names,
            exclude,
            text,
        }
    }

    fn admits(&self, provider: &str) -> bool {
        if self.names.is_empty() {
            return true;
        }
        self.names.iter().any(|n| n == provider) != self.exclude
    }
}

/// `fi_info -e` / `-g SUBSTR`: the library's settings table, in fi_info's layout.
fn env_text(filter: &str) -> String {
    let filter = filter.to_uppercase();
    let mut out = String::new();
    for s in SETTINGS
        .iter()
        .filter(|s| s.name.to_uppercase().contains(&filter))
    {
        let _ = write!(
            out,
            "# {}: {}\n# {} (default: {})\n\n",
            s.name, s.kind, s.meaning, s.default
        );
    }
    out
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
    parse_bits(list, "capability", xfabric::cap_from_str)
}

/// `FI_CONTEXT|FI_MSG_PREFIX` → the mode bits.
fn parse_mode(list: &str) -> Result<u64, String> {
    parse_bits(list, "mode", |name| {
        (0..64)
            .map(|b| 1u64 << b)
            .find(|&bit| mode_str(bit) == name)
    })
}

fn parse_bits(list: &str, what: &str, bit: impl Fn(&str) -> Option<u64>) -> Result<u64, String> {
    list.split('|').map(str::trim).try_fold(0, |acc, name| {
        bit(name)
            .map(|b| acc | b)
            .ok_or_else(|| format!("unrecognized {what} {name:?} in {list:?}"))
    })
}

fn parse_ep_type(name: &str) -> Result<EpType, String> {
    (0..=5)
        .filter_map(EpType::from_raw)
        .find(|t| t.c_name() == name)
        .ok_or_else(|| {
            format!("unrecognized endpoint type {name:?} (FI_EP_MSG, FI_EP_DGRAM, FI_EP_RDM, ...)")
        })
}

fn parse_addr_format(name: &str) -> Result<u32, String> {
    (0..=16)
        .find(|&f| addr_format_str(f) == name)
        .ok_or_else(|| {
            format!("unrecognized address format {name:?} (FI_FORMAT_UNSPEC, FI_ADDR_STR, ...)")
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
        Some(a) => format!("0x{}", xfabric::hex::encode(a)),
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
    use xfabric::{FI_CONTEXT, FI_MSG, FI_ORDER_DATA, FI_ORDER_SAS, FI_TAGGED};

    fn parse(v: &[&str]) -> Result<InfoArgs, clap::Error> {
        let cli = Cli::try_parse_from(["xfabric", "info"].iter().chain(v))?;
        match cli.command {
            Some(Command::Info(a)) => Ok(a),
            None => unreachable!("info was given"),
        }
    }

    #[test]
    fn options_parse_getopt_style() {
        let a = parse(&[
            "-vpshm",
            "--caps=FI_MSG | FI_TAGGED",
            "-t",
            "FI_EP_RDM",
            "-m",
            "FI_CONTEXT",
        ])
        .unwrap();
        assert!(a.verbose && !a.list);
        let h = a.hints();
        assert_eq!(h.fabric_attr.prov_name.as_deref(), Some("shm"));
        assert_eq!(h.caps, FI_MSG | FI_TAGGED);
        assert_eq!(h.mode, FI_CONTEXT);
        assert_eq!(h.ep_attr.ep_type, EpType::Rdm);
        assert_eq!(
            parse(&["-a", "FI_ADDR_STR"]).unwrap().hints().addr_format,
            FI_ADDR_STR
        );
        for bad in [
            &["-p"][..],
            &["-x"],
            &["-v=1"],
            &["-c", "FI_MSG|"],
            &["-t", "FI_EP_BOGUS"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn fi_provider_admits_and_excludes() {
        let f = |v: &str| ProviderFilter::from_env(Some(v));
        assert!(f("shm").admits("shm") && !f("tcp,verbs").admits("shm"));
        assert!(!f("^shm").admits("shm") && f("^tcp").admits("shm"));
        assert!(ProviderFilter::from_env(None).admits("shm"));
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
