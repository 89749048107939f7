//! Logging: xfabric reports through `tracing` (warnings for dropped peers, refused
//! cross-memory attach, fallbacks, bad settings; debug detail below that). It is off by default.
//!
//! An application with its own `tracing` subscriber sees xfabric's events there (targets
//! `xfabric_core`, `xfabric_providers`, ...). Otherwise, as libfabric does, xfabric writes them
//! to stderr itself when asked through the environment:
//!
//! - `FI_LOG_LEVEL=warn|info|debug|trace` (libfabric's variable and levels), or
//! - `RUST_LOG` in `tracing`'s target syntax (`warn`, `xfabric_providers=debug,info`, ...).
//!
//! `FI_LOG_LEVEL` wins where both are set. A value that names no level is reported on stderr
//! once, naming the variable, and logging stays off.

use std::str::FromStr;
use std::sync::Once;

use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;

/// libfabric's level names, as `FI_LOG_LEVEL` takes them, and the `tracing` level of each.
const FI_LEVELS: [(&str, LevelFilter); 4] = [
    ("warn", LevelFilter::WARN),
    ("info", LevelFilter::INFO),
    ("debug", LevelFilter::DEBUG),
    ("trace", LevelFilter::TRACE),
];

/// What the environment asks for: a filter, or why it cannot be read.
fn filter_from(
    fi_log_level: Option<&str>,
    rust_log: Option<&str>,
) -> Option<Result<Targets, String>> {
    if let Some(v) = fi_log_level {
        let v = v.trim().to_ascii_lowercase();
        return Some(
            FI_LEVELS
                .iter()
                .find(|(name, _)| *name == v)
                .map(|&(_, level)| Targets::new().with_default(level))
                .ok_or_else(|| {
                    format!(
                        "FI_LOG_LEVEL={v:?} is not a level (warn, info, debug or trace): logging stays off"
                    )
                }),
        );
    }
    let v = rust_log?;
    Some(Targets::from_str(v).map_err(|e| format!("RUST_LOG={v:?}: {e}: logging stays off")))
}

/// Installs the stderr logger the environment asks for, once per process; a no-op when it asks
/// for none or when the application already installed a global subscriber. Called when a
/// fabric is opened and by getinfo, so every program that reaches a provider has it.
pub fn init() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let fi = crate::settings::FI_LOG_LEVEL.text();
        let rust = crate::settings::RUST_LOG.text();
        match filter_from(fi, rust) {
            None => {}
            Some(Err(why)) => eprintln!("xfabric: {why}"),
            Some(Ok(filter)) => {
                let subscriber = tracing_subscriber::registry().with(filter).with(
                    tracing_subscriber::fmt::layer()
                        .with_writer(std::io::stderr)
                        .with_ansi(false),
                );
                // An application's own subscriber, installed first, is left in place.
                let _ = tracing::subscriber::set_global_default(subscriber);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing::Level;

    fn enabled(t: &Targets, target: &str, level: Level) -> bool {
        t.would_enable(target, &level)
    }

    #[test]
    fn fi_log_level_takes_libfabric_names_and_wins_over_rust_log() {
        let t = filter_from(Some("DEBUG"), Some("trace")).unwrap().unwrap();
        assert!(enabled(&t, "xfabric_providers", Level::DEBUG));
        assert!(!enabled(&t, "xfabric_providers", Level::TRACE));
        let t = filter_from(Some("warn"), None).unwrap().unwrap();
        assert!(enabled(&t, "xfabric_core", Level::WARN));
        assert!(!enabled(&t, "xfabric_core", Level::INFO));
    }

    #[test]
    fn rust_log_targets() {
        let t = filter_from(None, Some("xfabric_providers=debug,warn"))
            .unwrap()
            .unwrap();
        assert!(enabled(&t, "xfabric_providers", Level::DEBUG));
        assert!(!enabled(&t, "xfabric_core", Level::INFO));
        assert!(enabled(&t, "xfabric_core", Level::WARN));
    }

    #[test]
    fn nothing_asked_is_off_and_bad_values_say_which_variable() {
        assert!(filter_from(None, None).is_none());
        let e = filter_from(Some("loud"), None).unwrap().unwrap_err();
        assert!(e.contains("FI_LOG_LEVEL") && e.contains("loud"), "{e}");
        let e = filter_from(None, Some("x=notalevel")).unwrap().unwrap_err();
        assert!(e.contains("RUST_LOG"), "{e}");
    }
}
