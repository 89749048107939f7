//! What the XPU examples share: opening an shm endpoint with its queues, and the hex form
//! addresses travel in between the example and its peer process.

#![allow(dead_code)]

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
    let mut hints = Info {
        caps,
        ..Default::default()
    };
    hints.fabric_attr.prov_name = Some("shm".into());
    hints.ep_attr.ep_type = EpType::Rdm;
    hints.domain_attr.data_progress = progress;
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
    ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV).expect("bind cq");
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

pub fn die(why: &str) -> ! {
    eprintln!("{}: {why}", std::env::args().next().unwrap_or_default());
    std::process::exit(2)
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}
