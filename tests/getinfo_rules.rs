//! fi_getinfo(3)'s rules as every provider here answers them (shm and tcp; the same
//! `Info::fit` serves verbs): a source address in every answer, primary capabilities only
//! when asked (FI_XPU_TRIGGER and FI_HMEM included, even for empty hints), the attributes'
//! capabilities within fi_info's, domain capabilities, ordering asked of either side, ordering
//! sizes for the RMA orderings claimed, the 1.0 mr_mode values answered in their own terms,
//! the API version asked for, and FI_SOCKADDR matching tcp's socket addresses. fabtests'
//! fi_getinfo_test checks the same from C.

use xfabric::*;

const PROVIDERS: [&str; 2] = ["shm", "tcp"];

fn hints(prov: &str) -> Info {
    let mut h = Info::default();
    h.fabric_attr.prov_name = Some(prov.into());
    h.ep_attr.ep_type = EpType::Rdm;
    h
}

fn one(h: &Info) -> Result<Info> {
    getinfo(fi_version(1, 9), None, None, 0, Some(h)).map(|v| v[0].clone())
}

#[test]
fn every_answer_names_a_source_address_and_the_asked_version() {
    for p in PROVIDERS {
        let i = one(&hints(p)).unwrap();
        let src = i.src_addr.as_deref().unwrap_or_default();
        assert!(!src.is_empty(), "{p}: no src_addr without a node");
        assert_eq!(i.fabric_attr.api_version, fi_version(1, 9), "{p}");
        // And an endpoint opens from that answer as from one without it.
        let f = xfabric::fabric(&i.fabric_attr).unwrap();
        let ep = f.domain(&i).unwrap().endpoint(&i).unwrap();
        assert!(!ep.getname().unwrap().is_empty());
    }
}

#[test]
fn primary_capabilities_only_when_asked_and_sides_within_the_info() {
    for p in PROVIDERS {
        // Empty hints: everything but what must be asked for.
        let i = one(&hints(p)).unwrap();
        for c in [FI_XPU_TRIGGER, FI_HMEM] {
            assert_eq!(i.caps & c, 0, "{p}: {} unasked", caps_str(c));
            assert_eq!(i.tx_attr.caps & c, 0, "{p}: tx {} unasked", caps_str(c));
        }
        for h in [FI_MSG, FI_RMA | FI_ATOMIC, FI_TAGGED | FI_DIRECTED_RECV] {
            let mut hi = hints(p);
            hi.caps = h;
            let i = one(&hi).unwrap();
            assert_eq!(
                i.caps & FI_PRIMARY_CAPS & !h,
                0,
                "{p}: {}",
                caps_str(i.caps)
            );
            assert_eq!(i.tx_attr.caps & !i.caps, 0, "{p}: tx beyond the info");
            assert_eq!(i.rx_attr.caps & !i.caps, 0, "{p}: rx beyond the info");
            assert_eq!(i.caps & h, h);
        }
        // Asked for: given (FI_XPU_TRIGGER with FI_TRIGGER, as fi_trigger(3) requires).
        let mut hi = hints(p);
        hi.caps = FI_MSG | FI_TRIGGER | FI_XPU_TRIGGER;
        let i = one(&hi).unwrap();
        assert_ne!(i.tx_attr.caps & FI_XPU_TRIGGER, 0, "{p}");
    }
}

#[test]
fn domain_capabilities_are_reported_and_matched() {
    for (p, has) in [
        ("shm", FI_LOCAL_COMM),
        ("tcp", FI_LOCAL_COMM | FI_REMOTE_COMM),
    ] {
        let mut h = hints(p);
        h.domain_attr.caps = has;
        let i = one(&h).unwrap();
        assert_eq!(i.domain_attr.caps & has, has, "{p}");
        h.domain_attr.caps = FI_SHARED_AV;
        assert_eq!(one(&h).unwrap_err().errno(), errno::FI_ENODATA, "{p}");
    }
}

#[test]
fn ordering_of_either_side_is_filtered_and_rma_orderings_have_sizes() {
    for p in PROVIDERS {
        let mut h = hints(p);
        h.caps = FI_MSG | FI_RMA;
        // RAS and WAS are not claimed: asking either side for them finds nothing.
        for order in [FI_ORDER_RAS, FI_ORDER_WAS] {
            let mut t = h.clone();
            t.tx_attr.msg_order = order;
            assert_eq!(one(&t).unwrap_err().errno(), errno::FI_ENODATA, "{p} tx");
            let mut r = h.clone();
            r.rx_attr.msg_order = order;
            assert_eq!(one(&r).unwrap_err().errno(), errno::FI_ENODATA, "{p} rx");
        }
        let i = one(&h).unwrap();
        for (o, size) in [
            (FI_ORDER_RAW, i.ep_attr.max_order_raw_size),
            (FI_ORDER_WAR, i.ep_attr.max_order_war_size),
            (FI_ORDER_WAW, i.ep_attr.max_order_waw_size),
        ] {
            if (i.tx_attr.msg_order | i.rx_attr.msg_order) & o != 0 {
                assert!(size > 0, "{p}: {} claimed with size 0", order_str(o));
            }
        }
        // A size beyond the provider's: nothing.
        let mut big = h.clone();
        big.tx_attr.msg_order = FI_ORDER_RAW;
        big.ep_attr.max_order_raw_size = i.ep_attr.max_order_raw_size + 1;
        assert_eq!(one(&big).unwrap_err().errno(), errno::FI_ENODATA, "{p}");
    }
}

#[test]
fn basic_and_scalable_mr_modes_are_answered_as_asked() {
    for p in PROVIDERS {
        for mode in [FI_MR_BASIC, FI_MR_SCALABLE] {
            let mut h = hints(p);
            h.caps = FI_RMA;
            h.domain_attr.mr_mode = mode;
            let i = one(&h).unwrap();
            assert_eq!(i.domain_attr.mr_mode, mode, "{p}");
        }
        // A domain opened in basic mode chooses keys and takes virtual addresses.
        let mut h = hints(p);
        h.caps = FI_RMA;
        h.domain_attr.mr_mode = FI_MR_BASIC;
        let i = one(&h).unwrap();
        let d = xfabric::fabric(&i.fabric_attr).unwrap().domain(&i).unwrap();
        let buf = vec![0u8; 64];
        // SAFETY: `buf` outlives the region.
        let mr = unsafe { d.mr_reg(&buf, FI_REMOTE_WRITE, 0, 1234) }.unwrap();
        assert_ne!(mr.key(), 1234, "{p}: basic mode's keys are the provider's");
        drop(mr);
    }
}

#[test]
fn fi_sockaddr_matches_tcp_socket_addresses() {
    let mut h = hints("tcp");
    h.addr_format = FI_SOCKADDR;
    let i = one(&h).unwrap();
    assert!(
        matches!(i.addr_format, FI_SOCKADDR_IN | FI_SOCKADDR_IN6),
        "{}",
        i.addr_format
    );
    // shm's addresses are strings: no socket address there.
    let mut h = hints("shm");
    h.addr_format = FI_SOCKADDR;
    assert_eq!(one(&h).unwrap_err().errno(), errno::FI_ENODATA);
}
