//! Debian's `fi_info` (libfabric-bin) run on this libfabric.so: the provider list, the short
//! and the verbose (`fi_tostr(FI_TYPE_INFO)`) listings, the parameter list, and `FI_PROVIDER`
//! and capability hints that leave nothing.
//!
//! Skipped with a printed reason where fi_info is not installed (scripts/setup.sh installs
//! it), except under CI.

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

mod common;
use common::{output_within, so1_dir};

const FI_INFO: &str = "/usr/bin/fi_info";

fn have_fi_info() -> bool {
    let ok = Path::new(FI_INFO).exists();
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI needs libfabric-bin (scripts/setup.sh)"
        );
        eprintln!("skipped: {FI_INFO} missing (libfabric-bin; scripts/setup.sh installs it)");
    }
    ok
}

/// Debian's fi_info with `args`, loading xfabric; `env` added to a clean libfabric environment.
fn fi_info(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(FI_INFO);
    cmd.args(args)
        .env("LD_LIBRARY_PATH", so1_dir())
        .env_remove("FI_PROVIDER")
        .env_remove("FI_LOG_LEVEL")
        .envs(env.iter().copied());
    output_within(cmd, Duration::from_secs(60), &format!("fi_info {args:?}"))
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The version fi_info shows for shm: the provider's own.
fn shm_version() -> String {
    let shm = xfabric::provider_list()
        .into_iter()
        .find(|p| p.name() == "shm")
        .expect("this build has shm");
    xfabric::tostr::version_str(shm.version())
}

#[test]
fn fi_info_lists_shm_as_an_rdm_provider() {
    if !have_fi_info() {
        return;
    }
    let out = fi_info(&["-p", "shm"], &[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("provider: shm"), "{t}");
    assert!(t.contains("type: FI_EP_RDM"), "{t}");
    assert!(t.contains(&format!("version: {}", shm_version())), "{t}");

    let out = fi_info(&["-l"], &[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains(&format!("shm:\n    version: {}", shm_version())),
        "{t}"
    );
}

#[test]
fn fi_info_verbose_prints_fi_tostr_of_the_info() {
    if !have_fi_info() {
        return;
    }
    let out = fi_info(&["-v", "-p", "shm"], &[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("---\nfi_info:\n    caps: [ FI_MSG"), "{t}");
    let caps = t.lines().nth(2).expect("caps line");
    assert!(caps.contains("FI_LOCAL_COMM"), "{caps}");
    assert!(!caps.contains("FI_REMOTE_COMM"), "{caps}");
    for line in [
        "        type: FI_EP_RDM",
        "        prov_name: shm",
        "    addr_format: FI_ADDR_STR",
    ] {
        assert!(t.contains(line), "{line:?} missing in\n{t}");
    }
    assert!(
        t.contains(&format!("        prov_version: {}", shm_version())),
        "{t}"
    );
}

#[test]
fn fi_info_shows_xfabrics_settings() {
    if !have_fi_info() {
        return;
    }
    let out = fi_info(&["-e"], &[("XFABRIC_SHM_CMA", "0")]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for s in xfabric::settings::SETTINGS {
        assert!(
            t.contains(&format!("# {}:", s.name)),
            "{} missing in\n{t}",
            s.name
        );
    }
}

#[test]
fn fi_provider_and_caps_that_leave_nothing_are_no_data() {
    if !have_fi_info() {
        return;
    }
    let ok = fi_info(&[], &[("FI_PROVIDER", "shm")]);
    assert!(ok.status.success(), "{}", text(&ok));
    // tcp is there, and reaches other hosts.
    let tcp = fi_info(&["-p", "tcp", "-v"], &[]);
    assert!(tcp.status.success(), "{}", text(&tcp));
    assert!(text(&tcp).contains("FI_REMOTE_COMM"), "{}", text(&tcp));
    for (args, env) in [
        (&[][..], &[("FI_PROVIDER", "^shm,tcp")][..]),
        (&[][..], &[("FI_PROVIDER", "verbs")][..]),
        (&["-p", "verbs"][..], &[][..]),
        (&["-c", "FI_REMOTE_COMM"][..], &[("FI_PROVIDER", "shm")][..]),
    ] {
        let out = fi_info(args, env);
        let t = text(&out);
        assert!(!out.status.success(), "{args:?} {env:?}: {t}");
        assert!(t.contains("fi_getinfo: -61"), "{args:?} {env:?}: {t}");
    }
}

#[test]
fn fi_info_verbose_shows_that_tcp_takes_an_auth_key() {
    if !have_fi_info() {
        return;
    }
    // fi_domain(3): auth_key_size is 0 where keys are not available.
    for (prov, size) in [("tcp", 32), ("shm", 0)] {
        let out = fi_info(&["-v", "-p", prov], &[]);
        let t = text(&out);
        assert!(out.status.success(), "{t}");
        let dom = t.split("fi_domain_attr:").nth(1).expect("a domain section");
        assert!(
            dom.contains(&format!("auth_key_size: {size}")),
            "{prov}: {dom}"
        );
    }
}
