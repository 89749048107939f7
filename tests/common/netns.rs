//! Two "hosts" for multi-host tests: two network namespaces joined by a veth pair, made by
//! the test and removed when it ends (also when it fails). Where namespaces cannot be made (not
//! root, no `ip`), `hosts_or_skip` says so and the test skips. Used by tests/tcp_netns.rs and
//! capi/tests/mpi.rs (included by path).

use std::process::{Command, Stdio};

/// Two namespaces with one address each, removed on drop.
pub struct Hosts {
    pub a: String,
    pub b: String,
    pub ip_a: String,
    /// B's end of the veth pair (inside B).
    pub dev_b: String,
}

pub fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Hosts {
    /// `which` tells apart the pairs one test process makes (one per test).
    pub fn make(which: u32) -> Result<Hosts, String> {
        let id = std::process::id();
        let a = format!("xf{id}{which}a");
        let b = format!("xf{id}{which}b");
        // 10.(200+which).N.0/24, N from our pid: runs at once get different subnets.
        let net = format!("10.{}.{}", 200 + which, id % 250);
        let hosts = Hosts {
            a: a.clone(),
            b: b.clone(),
            ip_a: format!("{net}.1"),
            dev_b: format!("{b}0"),
        };
        ip(&["netns", "add", &a])?;
        // From here on, drop removes whatever was made.
        let h = hosts;
        ip(&["netns", "add", &b])?;
        let (va, vb) = (format!("{a}0"), format!("{b}0"));
        ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb])?;
        if let Err(e) = ip(&["link", "set", &va, "netns", &a]) {
            let _ = ip(&["link", "del", &va]);
            return Err(e);
        }
        ip(&["link", "set", &vb, "netns", &b])?;
        for (ns, dev, addr) in [
            (&a, &va, format!("{net}.1/24")),
            (&b, &vb, format!("{net}.2/24")),
        ] {
            ip(&["-n", ns, "addr", "add", &addr, "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(h)
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        // Deleting a namespace kills nothing by itself: our processes were reaped already
        // (bounded waits); the veth pair goes with the namespace.
        let _ = ip(&["netns", "del", &self.a]);
        let _ = ip(&["netns", "del", &self.b]);
    }
}

pub fn hosts_or_skip(which: u32) -> Option<Hosts> {
    match Hosts::make(which) {
        Ok(h) => Some(h),
        Err(why) => {
            eprintln!("skipped: cannot make network namespaces here ({why})");
            None
        }
    }
}
