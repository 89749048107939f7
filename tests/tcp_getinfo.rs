//! getinfo for tcp as libfabric's tcp answers it: node/service name the peer (dest_addr), or
//! with FI_SOURCE where to listen (src_addr); IPv4 and IPv6 address formats; FI_ADDR_STR;
//! and an endpoint opened from such an answer listens where it says.

use std::net::{SocketAddr, TcpListener};

use xfabric::providers::inet;
use xfabric::*;

fn hints(format: u32) -> Info {
    let mut h = Info {
        caps: FI_MSG | FI_TAGGED,
        addr_format: format,
        ..Default::default()
    };
    h.fabric_attr.prov_name = Some("tcp".into());
    h.ep_attr.ep_type = EpType::Rdm;
    h
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn node_and_service_name_the_peer_or_with_fi_source_ourselves() {
    let port = free_port().to_string();
    let want: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let v = getinfo(
        fi_version(1, 17),
        Some("127.0.0.1"),
        Some(&port),
        0,
        Some(&hints(FI_FORMAT_UNSPEC)),
    )
    .unwrap();
    assert_eq!(v[0].addr_format, FI_SOCKADDR_IN);
    assert_eq!(v[0].dest_addr.as_deref(), Some(&inet::encode(&want)[..]));
    // The source is where an endpoint from this answer listens: any port.
    let src = inet::decode(v[0].src_addr.as_deref().expect("a source")).unwrap();
    assert_eq!(src.port(), 0);
    assert!(v[0].caps & FI_REMOTE_COMM != 0);

    let v = getinfo(
        fi_version(1, 17),
        Some("127.0.0.1"),
        Some(&port),
        FI_SOURCE,
        Some(&hints(FI_FORMAT_UNSPEC)),
    )
    .unwrap();
    let info = v[0].clone();
    assert_eq!(info.src_addr.as_deref(), Some(&inet::encode(&want)[..]));
    // An endpoint from that answer listens there: its name is that address, and the port is
    // taken.
    let fabric = xfabric::fabric(&info.fabric_attr).unwrap();
    let domain = fabric.domain(&info).unwrap();
    let ep = domain.endpoint(&info).unwrap();
    assert_eq!(ep.getname().unwrap(), inet::encode(&want));
    assert!(
        TcpListener::bind(want).is_err(),
        "the endpoint listens there"
    );
    // A second endpoint on the same address: the port is in use, a typed error.
    let err = domain.endpoint(&info).err().expect("port in use");
    assert!(err.to_string().contains("listen on"), "{err}");
}

/// An answer toward a remote IPv6 peer names the source the host sends from toward it (an
/// endpoint connects from its name), not the loopback, which could reach no remote peer. The
/// peer is 2001:db8::1 (a documentation address, never dialed): where the host has no IPv6
/// route there, the answer names no source and the test says so.
#[test]
fn an_answer_toward_a_remote_ipv6_peer_names_a_reachable_source() {
    let v = getinfo(
        fi_version(1, 17),
        Some("2001:db8::1"),
        Some("5000"),
        0,
        Some(&hints(FI_SOCKADDR_IN6)),
    )
    .unwrap();
    let Some(route) = inet::route_src("[2001:db8::1]:5000".parse().unwrap()) else {
        eprintln!("skipped: no IPv6 route to 2001:db8::1 here");
        return;
    };
    let src = v[0]
        .src_addr
        .as_deref()
        .expect("a source toward a routed IPv6 peer");
    let a = inet::decode(src).unwrap();
    assert!(a.is_ipv6() && !a.ip().is_loopback(), "{a}");
    assert_eq!(a.ip(), route);
}

#[test]
fn ipv6_and_string_formats() {
    let port = free_port().to_string();
    let v = getinfo(
        fi_version(1, 17),
        Some("::1"),
        Some(&port),
        FI_SOURCE,
        Some(&hints(FI_SOCKADDR_IN6)),
    );
    match v {
        Ok(v) => {
            assert_eq!(v[0].addr_format, FI_SOCKADDR_IN6);
            let a = inet::decode(v[0].src_addr.as_deref().unwrap()).unwrap();
            assert!(a.is_ipv6() && a.port().to_string() == port);
        }
        // Hosts without IPv6 loopback say so.
        Err(e) => eprintln!("skipped: no IPv6 here ({e})"),
    }
    let v = getinfo(
        fi_version(1, 17),
        Some("127.0.0.1"),
        Some(&port),
        0,
        Some(&hints(FI_ADDR_STR)),
    )
    .unwrap();
    assert_eq!(v[0].addr_format, FI_ADDR_STR);
    let s = String::from_utf8(v[0].dest_addr.clone().unwrap()).unwrap();
    assert_eq!(
        s.trim_end_matches('\0'),
        format!("fi_sockaddr_in://127.0.0.1:{port}")
    );
    // An endpoint of that format names itself the same way.
    let mut h = hints(FI_ADDR_STR);
    h.src_addr = None;
    let info = getinfo(fi_version(1, 17), None, None, 0, Some(&h)).unwrap()[0].clone();
    let fabric = xfabric::fabric(&info.fabric_attr).unwrap();
    let ep = fabric.domain(&info).unwrap().endpoint(&info).unwrap();
    let name = String::from_utf8(ep.getname().unwrap()).unwrap();
    assert!(name.starts_with("fi_sockaddr_in://"), "{name}");
}

#[test]
fn bad_names_are_no_data_not_panics() {
    for (node, service) in [
        (Some("no.such.host.invalid"), Some("1")),
        (Some("127.0.0.1"), Some("not-a-port")),
        (Some("127.0.0.1"), Some("99999")),
    ] {
        let e = getinfo(
            fi_version(1, 17),
            node,
            service,
            0,
            Some(&hints(FI_FORMAT_UNSPEC)),
        )
        .expect_err("nothing to offer");
        assert_eq!(e.errno(), errno::FI_ENODATA, "{e}");
    }
}
