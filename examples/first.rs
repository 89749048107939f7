//! A first program: two endpoints of the shm provider in one process; one sends "hello", the
//! other receives it. README.md shows this file as it is (tests/docs_links.rs checks that).
use xfabric::prelude::*;

fn main() -> xfabric::Result<()> {
    // Ask for messaging over shm; getinfo answers with what the provider offers.
    let mut hints = Info {
        caps: FI_MSG,
        ..Default::default()
    };
    hints.fabric_attr.prov_name = Some("shm".into());
    let info = &getinfo(fi_version(1, 17), None, None, 0, Some(&hints))?[0];
    let domain = fabric(&info.fabric_attr)?.domain(info)?;

    // An endpoint with its completion queue (blocking reads) and address vector.
    let open = || -> xfabric::Result<(Endpoint, CompletionQueue, AddressVector)> {
        let cq = domain.cq_open(&CqAttr {
            format: CqFormat::Msg,
            wait_obj: WaitObj::Unspec,
            ..Default::default()
        })?;
        let av = domain.av_open(&AvAttr::default())?;
        let ep = domain.endpoint(info)?;
        ep.bind_cq(&cq, FI_TRANSMIT | FI_RECV)?;
        ep.bind_av(&av)?;
        ep.enable()?;
        Ok((ep, cq, av))
    };
    let (sender, tx_cq, tx_av) = open()?;
    let (receiver, rx_cq, _rx_av) = open()?;
    let to = tx_av.insert_one(&receiver.getname()?)?; // the name would travel out of band

    let mut inbox = [0u8; 5];
    let hello = *b"hello";
    // SAFETY: both buffers stay alive and untouched until their completions are read below.
    unsafe {
        receiver.recv(&mut inbox, None, FI_ADDR_UNSPEC, 1)?;
        sender.send(&hello, None, to, 2)?;
    }
    let mut done = [CqMsgEntry::default()];
    tx_cq.sread(&mut done, 1, 10_000)?; // waits at most 10 s; Err(Again) past it
    rx_cq.sread(&mut done, 1, 10_000)?;
    assert_eq!((done[0].op_context, done[0].len), (1, 5));
    println!("received {:?}", String::from_utf8_lossy(&inbox));
    Ok(())
}
