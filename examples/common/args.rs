//! The examples' command lines, parsed by clap: `--help` prints the usage and exits 0; any bad
//! argument (unknown flag, bad or negative number, text that is not UTF-8) is one line on
//! stderr and exit status 2, never a panic.

use clap::error::ErrorKind;
use clap::Parser;

/// `T` from this process's arguments, or the process ends as described above.
pub fn parse<T: Parser>() -> T {
    match T::try_parse() {
        Ok(t) => t,
        Err(e) => exit_for(e),
    }
}

/// Help and version go to stdout with success; errors become their first line.
pub fn exit_for(e: clap::Error) -> ! {
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        std::process::exit(0);
    }
    let text = e.to_string();
    let first = text.lines().next().unwrap_or("bad arguments");
    let prog = std::env::args_os()
        .next()
        .and_then(|p| {
            std::path::Path::new(&p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    eprintln!(
        "{prog}: {} (--help for usage)",
        first.trim_start_matches("error: ")
    );
    std::process::exit(2)
}

/// A count of at least 1 (`--rounds 0`, `-5` and `ten` are refused with the reason).
pub fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("{s:?} is not a positive whole number")),
    }
}
