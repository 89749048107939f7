//! What the XPU examples share: opening an endpoint (shm unless told) with its queues, and the hex form
//! addresses travel in between the example and its peer process.

#![allow(dead_code)]

pub mod args;

use xfabric::*;

/// An enabled RDM endpoint with a tagged-format CQ for both directions and a table AV.
pub struct Node {
    pub fabric: Fabric,
    pub domain: Domain,
    pub cq: CompletionQueue,
    pub av: AddressVector,
    pub ep: Endpoint,
}

/// Opens an shm endpoint with `caps` under `progress`; exits with the reason on failure.
pub fn open(caps: u64, progress: Progress) -> Node {
    open_on("shm", caps, progress)
}

/// Opens an endpoint of `provider` with `caps` under `progress`; exits with the reason on
/// failure.
pub fn open_on(provider: &str, caps: u64, progress: Progress) -> Node {
    open_with(provider, caps, progress, |_| {})
}

/// As `open_on`, with `adjust` changing the hints last (a memory-registration mode, say).
pub fn open_with(
    provider: &str,
    caps: u64,
    progress: Progress,
    adjust: impl FnOnce(&mut Info),
) -> Node {
    open_bound(provider, caps, progress, adjust, 0)
}

/// As `open_with`, the CQ bound with `FI_TRANSMIT | FI_RECV | bind` (`FI_SELECTIVE_COMPLETION`,
/// say).
pub fn open_bound(
    provider: &str,
    caps: u64,
    progress: Progress,
    adjust: impl FnOnce(&mut Info),
    bind: u64,
) -> Node {
    let mut hints = Info {
        caps,
        ..Default::default()
    };
    hints.fabric_attr.prov_name = Some(provider.into());
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.domain_attr.data_progress = progress;
    adjust(&mut hints);
    let info = getinfo(fi_version(1, 17), None, None, 0, Some(&hints))
        .unwrap_or_else(|e| die(&format!("getinfo: {e}")))[0]
        .clone();
    let fabric = xfabric::fabric(&info.fabric_attr).expect("fabric");
    let domain = fabric.domain(&info).expect("domain");
    let cq = domain
        .cq_open(&CqAttr {
            format: CqFormat::Tagged,
            size: 1 << 17,
            wait_obj: WaitObj::Unspec,
            ..Default::default()
        })
        .expect("cq");
    let av = domain.av_open(&AvAttr::default()).expect("av");
    let ep = domain.endpoint(&info).expect("endpoint");
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV | bind)
        .expect("bind cq");
    ep.bind_av(&av).expect("bind av");
    ep.enable().expect("enable");
    Node {
        fabric,
        domain,
        cq,
        av,
        ep,
    }
}

impl Node {
    /// Waits for `n` completions (60 s at most) reading the CQ without sleeping (each read
    /// drives progress). Calls `fail` on an error entry or past the bound.
    pub fn spin(&self, n: usize, fail: fn(&str) -> !) -> Vec<CqTaggedEntry> {
        let mut out = Vec::with_capacity(n);
        let mut buf = [CqTaggedEntry::default(); 64];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut idle = 0u32;
        while out.len() < n {
            let want = &mut buf[..(n - out.len()).min(64)];
            match self.cq.read(want) {
                Ok(k) => {
                    out.extend_from_slice(&buf[..k]);
                    idle = 0;
                }
                Err(Error::Again(_)) => {
                    idle += 1;
                    // The clock is read now and then, not on every empty poll.
                    if idle.is_multiple_of(4096) && std::time::Instant::now() > deadline {
                        fail(&format!("timed out: {} of {n} completions", out.len()));
                    }
                    std::hint::spin_loop();
                }
                Err(e) => fail(&format!("completion: {e}: {:?}", self.cq.readerr())),
            }
        }
        out
    }
}

pub fn die(why: &str) -> ! {
    let prog = std::env::args_os().next().unwrap_or_default();
    eprintln!("{}: {why}", prog.to_string_lossy());
    std::process::exit(2)
}

/// An address in hex (the library's one helper).
pub fn hex(b: &[u8]) -> String {
    xfabric::hex::encode(b)
}

/// A peer's hex address; text that is not one ends the program with the reason.
pub fn unhex(s: &str) -> Vec<u8> {
    xfabric::hex::decode(s).unwrap_or_else(|e| die(&e))
}
