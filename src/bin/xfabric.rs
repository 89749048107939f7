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
    addr_format_str, fi_version, mode_str, EpType, Info, FI_MAJOR_VERSION, FI_MINOR_VERSION,
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
        let allowed =
            xfabric::tostr::ProviderFilter::from_env(xfabric::settings::FI_PROVIDER.text());
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
                one.push_str("---\n");
                xfabric::tostr::write_verbose(&mut one, info);
            } else {
                xfabric::tostr::write_short(&mut one, info);
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
            xfabric::tostr::version_str(p.version())
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use xfabric::{FI_ADDR_STR, FI_CONTEXT, FI_MSG, FI_TAGGED};

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
}
