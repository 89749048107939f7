//! fi_getinfo as real clients call it (fabtests' sequence), through the exported functions.

use std::ffi::{c_int, CStr};
use std::ptr::{null, null_mut};

use fabric::info::FiInfo;
use fabric::{fi_dupinfo, fi_freeinfo, fi_getinfo, fi_tostr, FI_EINVAL};

const FI_CONTEXT: u64 = 1 << 59;
const FI_CONTEXT2: u64 = 1 << 52;
const FI_SOURCE: u64 = 1 << 57;
const FI_MSG: u64 = 1 << 1;
const FI_TAGGED: u64 = 1 << 3;
const FI_EP_RDM: c_int = 3;
const FI_MR_LOCAL: c_int = 1 << 2;
const FI_MR_VIRT_ADDR: c_int = 1 << 4;
const FI_MR_ALLOCATED: c_int = 1 << 5;
const FI_MR_PROV_KEY: c_int = 1 << 6;
const FI_MR_ENDPOINT: c_int = 1 << 8;

fn version(minor: u32) -> u32 {
    (1 << 16) | minor
}

/// fabtests' hints: RDM, messages and tags, the context modes, the mr_mode bits clients
/// declare, provider shm.
fn hints() -> *mut FiInfo {
    // SAFETY: fi_dupinfo(NULL) is fi_allocinfo.
    let h = unsafe { fi_dupinfo(null()) };
    assert!(!h.is_null());
    // SAFETY: h is a fresh entry with every attribute allocated.
    unsafe {
        (*h).caps = FI_MSG | FI_TAGGED;
        (*h).mode = FI_CONTEXT | FI_CONTEXT2;
        (*(*h).ep_attr).type_ = FI_EP_RDM;
        (*(*h).domain_attr).mr_mode =
            FI_MR_LOCAL | FI_MR_ENDPOINT | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
        (*(*h).fabric_attr).prov_name = libc::strdup(c"shm".as_ptr());
    }
    h
}

fn getinfo(
    v: u32,
    node: Option<&CStr>,
    flags: u64,
    h: *const FiInfo,
) -> Result<*mut FiInfo, c_int> {
    let mut info = null_mut();
    // SAFETY: valid strings and hints; info writable.
    let rc = unsafe {
        fi_getinfo(
            v,
            node.map_or(null(), CStr::as_ptr),
            null(),
            flags,
            h,
            &mut info,
        )
    };
    if rc == 0 {
        assert!(!info.is_null());
        Ok(info)
    } else {
        assert!(rc < 0, "{rc}");
        Err(rc)
    }
}

#[test]
fn source_lookup_then_again_with_the_first_answers_address() {
    let h = hints();
    let first = getinfo(version(17), Some(c"127.0.0.1"), FI_SOURCE, h).expect("first getinfo");
    // SAFETY: first is a valid list from fi_getinfo; h is ours.
    unsafe {
        let f = &*first;
        assert_eq!(
            CStr::from_ptr((*f.fabric_attr).prov_name).to_str().unwrap(),
            "shm"
        );
        assert_eq!((*f.ep_attr).type_, FI_EP_RDM);
        assert_eq!(f.caps & (FI_MSG | FI_TAGGED), FI_MSG | FI_TAGGED);
        // Only what the caller can handle.
        assert_eq!(f.mode & !(FI_CONTEXT | FI_CONTEXT2), 0);
        let allowed =
            FI_MR_LOCAL | FI_MR_ENDPOINT | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_VIRT_ADDR;
        assert_eq!((*f.domain_attr).mr_mode & !allowed, 0);
        // Narrowed to what shm needs: no descriptors, registrations or binds to make; the
        // two addressing choices the caller allowed stay.
        assert_eq!(
            (*f.domain_attr).mr_mode,
            FI_MR_PROV_KEY | FI_MR_VIRT_ADDR,
            "mr_mode of the answer"
        );
        // Again, as clients do, with the first answer's source address in the hints.
        let h2 = fi_dupinfo(first);
        assert!(!h2.is_null());
        let second = getinfo(version(17), None, 0, h2).expect("second getinfo");
        assert_eq!((*second).src_addrlen, f.src_addrlen);
        fi_freeinfo(second);
        fi_freeinfo(h2);
        fi_freeinfo(first);
        fi_freeinfo(h);
    }
}

#[test]
fn every_api_version_from_1_5_answers() {
    let h = hints();
    for minor in 5..=17 {
        let i = getinfo(version(minor), None, 0, h).unwrap_or_else(|e| panic!("1.{minor}: {e}"));
        // SAFETY: a list from fi_getinfo.
        unsafe { fi_freeinfo(i) };
    }
    assert!(
        getinfo(version(18), None, 0, h).is_err(),
        "a future version"
    );
    // SAFETY: ours.
    unsafe { fi_freeinfo(h) };
}

#[test]
fn bad_hints_and_null_answers_are_einval() {
    // SAFETY (whole test): the pointers are ours and valid, or null where that is the point.
    unsafe {
        assert_eq!(
            fi_getinfo(version(17), null(), null(), 0, null(), null_mut()),
            -FI_EINVAL
        );
        let h = hints();
        (*(*h).ep_attr).type_ = 77;
        assert_eq!(getinfo(version(17), None, 0, h), Err(-FI_EINVAL));
        (*(*h).ep_attr).type_ = FI_EP_RDM;
        (*(*h).domain_attr).threading = -3;
        assert_eq!(getinfo(version(17), None, 0, h), Err(-FI_EINVAL));
        fi_freeinfo(h);
    }
}

#[test]
fn tostr_prints_an_info_and_its_enums() {
    let h = hints();
    let i = getinfo(version(17), None, 0, h).expect("getinfo");
    // SAFETY: i is a valid fi_info; fi_tostr's answer is a C string.
    unsafe {
        let t = CStr::from_ptr(fi_tostr(i.cast(), 0))
            .to_str()
            .unwrap()
            .to_owned();
        assert!(t.starts_with("fi_info:\n    caps: [ FI_MSG"), "{t}");
        assert!(t.contains("prov_name: shm"), "{t}");
        let ty = FI_EP_RDM;
        let t = CStr::from_ptr(fi_tostr((&raw const ty).cast(), 1));
        assert_eq!(t.to_str().unwrap(), "FI_EP_RDM");
        // A value outside the enum, an unknown type and null data: empty, never null.
        let bad: c_int = 99;
        assert_eq!(
            CStr::from_ptr(fi_tostr((&raw const bad).cast(), 1)).to_bytes(),
            b""
        );
        assert_eq!(
            CStr::from_ptr(fi_tostr((&raw const bad).cast(), 999)).to_bytes(),
            b""
        );
        assert_eq!(CStr::from_ptr(fi_tostr(null(), 0)).to_bytes(), b"");
        // The atomic datatypes and operations, and the deferred work operation types
        // (FI_TYPE_ATOMIC_TYPE 16, FI_TYPE_ATOMIC_OP 17, FI_TYPE_OP_TYPE 22).
        for (value, ty, want) in [
            (6, 16, "FI_INT64"),
            (15, 16, "FI_UINT128"),
            (2, 17, "FI_SUM"),
            (12, 17, "FI_CSWAP"),
            (1, 22, "FI_OP_SEND"),
            (10, 22, "FI_OP_CNTR_ADD"),
        ] {
            let v: c_int = value;
            let t = CStr::from_ptr(fi_tostr((&raw const v).cast(), ty));
            assert_eq!(t.to_str().unwrap(), want);
        }
        let mut buf = [0x7f_i8; 6];
        fabric::fi_tostr_r(buf.as_mut_ptr(), buf.len(), (&raw const ty).cast(), 1);
        assert_eq!(CStr::from_ptr(buf.as_ptr()).to_bytes(), b"FI_EP");
        fi_freeinfo(i);
        fi_freeinfo(h);
    }
}

#[test]
fn getparams_lists_the_settings_table() {
    let mut p = null_mut();
    let mut n: c_int = -1;
    // SAFETY: both writable; the list is freed with fi_freeparams.
    unsafe {
        assert_eq!(fabric::fi_getparams(&mut p, &mut n), 0);
        let n = usize::try_from(n).unwrap();
        assert_eq!(n, xfabric::settings::SETTINGS.len());
        let names: Vec<String> = (0..n)
            .map(|i| {
                CStr::from_ptr((*p.add(i)).name)
                    .to_str()
                    .unwrap()
                    .to_owned()
            })
            .collect();
        assert!(names.iter().any(|n| n == "FI_PROVIDER"), "{names:?}");
        assert!((*p.add(n)).name.is_null(), "terminated");
        fabric::fi_freeparams(p);
        assert_eq!(fabric::fi_getparams(null_mut(), null_mut()), -FI_EINVAL);
    }
}

#[test]
fn old_mr_modes_are_answered_in_their_own_terms() {
    const FI_MR_UNSPEC: c_int = 0;
    const FI_MR_BASIC: c_int = 1;
    const FI_MR_SCALABLE: c_int = 2;
    // fabtests' mr_mode tests: FI_MR_BASIC and FI_MR_SCALABLE at 1.9 and 1.0; an unspecified
    // mode at 1.0 (the old enumeration) gets one of the two.
    for (minor, asked, answered) in [
        (9, FI_MR_BASIC, FI_MR_BASIC),
        (9, FI_MR_SCALABLE, FI_MR_SCALABLE),
        (0, FI_MR_BASIC, FI_MR_BASIC),
        (0, FI_MR_SCALABLE, FI_MR_SCALABLE),
        (0, FI_MR_UNSPEC, FI_MR_SCALABLE),
    ] {
        let h = hints();
        // SAFETY: h and the answer are lists of our own, freed once.
        unsafe {
            (*h).mode = 0;
            (*(*h).domain_attr).mr_mode = asked;
            let i = getinfo(version(minor), None, 0, h).expect("an answer");
            assert_eq!((*(*i).domain_attr).mr_mode, answered, "1.{minor}, {asked}");
            fi_freeinfo(i);
            fi_freeinfo(h);
        }
    }
}

const FI_ENODATA: c_int = 61;
const FI_PROV_ATTR_ONLY: u64 = 1 << 54;
const FI_HMEM: u64 = 1 << 47;
const FI_SOCKADDR_IN: u32 = 2;

/// Hints for `prov`, with nothing else asked for.
fn plain_hints(prov: &CStr) -> *mut FiInfo {
    // SAFETY: fi_dupinfo(NULL) is fi_allocinfo; h is a fresh entry.
    unsafe {
        let h = fi_dupinfo(null());
        assert!(!h.is_null());
        (*(*h).fabric_attr).prov_name = libc::strdup(prov.as_ptr());
        h
    }
}

#[test]
fn hints_libfabric_checks_are_checked_from_c() {
    // SAFETY: hints and answers are lists of our own, each freed once; the key outlives the
    // calls that read it.
    unsafe {
        // A key given to a provider that takes none: no answer (it would not isolate).
        let key = [1u8, 2, 3, 4];
        let h = plain_hints(c"shm");
        (*(*h).ep_attr).auth_key = key.as_ptr().cast_mut();
        (*(*h).ep_attr).auth_key_size = key.len();
        assert_eq!(getinfo(version(17), None, 0, h).err(), Some(-FI_ENODATA));
        (*(*h).ep_attr).auth_key = null_mut();
        (*(*h).ep_attr).auth_key_size = 0;
        // Completion order and shared contexts it does not have; a default flag it cannot
        // apply.
        (*(*h).tx_attr).comp_order = 1 << 1; // FI_ORDER_STRICT
        assert_eq!(getinfo(version(17), None, 0, h).err(), Some(-FI_ENODATA));
        (*(*h).tx_attr).comp_order = 0;
        (*(*h).ep_attr).tx_ctx_cnt = usize::MAX; // FI_SHARED_CONTEXT
        assert_eq!(getinfo(version(17), None, 0, h).err(), Some(-FI_ENODATA));
        (*(*h).ep_attr).tx_ctx_cnt = 0;
        (*(*h).rx_attr).op_flags = 1 << 10; // FI_TRIGGER
        assert_eq!(getinfo(version(17), None, 0, h).err(), Some(-FI_ENODATA));
        (*(*h).rx_attr).op_flags = 0;
        // FI_SOURCE names this side by node or service: with neither, nothing.
        assert_eq!(
            getinfo(version(17), None, FI_SOURCE, h).err(),
            Some(-FI_ENODATA)
        );
        fi_freeinfo(h);

        // Before 1.5 keys are ignored, and mr_mode is one of the old three values.
        let h = plain_hints(c"tcp");
        (*(*h).domain_attr).auth_key = key.as_ptr().cast_mut();
        (*(*h).domain_attr).auth_key_size = key.len();
        let i = getinfo(version(4), None, 0, h).expect("1.4 with a key");
        assert_eq!((*(*i).domain_attr).auth_key_size, 0);
        assert!((*(*i).domain_attr).auth_key.is_null());
        fi_freeinfo(i);
        (*(*h).domain_attr).mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR;
        assert_eq!(getinfo(version(4), None, 0, h).err(), Some(-FI_ENODATA));
        // The key is ours, not the allocator's.
        (*(*h).domain_attr).auth_key = null_mut();
        (*(*h).domain_attr).auth_key_size = 0;
        fi_freeinfo(h);

        // tcp takes the hints' dest_addr where no node names the peer.
        let h = plain_hints(c"tcp");
        (*h).addr_format = FI_SOCKADDR_IN;
        let mut sa: libc::sockaddr_in = std::mem::zeroed();
        sa.sin_family = libc::AF_INET as libc::sa_family_t;
        sa.sin_port = 4242u16.to_be();
        sa.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        let raw = libc::malloc(std::mem::size_of::<libc::sockaddr_in>());
        std::ptr::copy_nonoverlapping(
            (&sa as *const libc::sockaddr_in).cast::<u8>(),
            raw.cast::<u8>(),
            std::mem::size_of::<libc::sockaddr_in>(),
        );
        (*h).dest_addr = raw;
        (*h).dest_addrlen = std::mem::size_of::<libc::sockaddr_in>();
        let i = getinfo(version(17), None, 0, h).expect("tcp with a dest_addr");
        assert_eq!((*i).dest_addrlen, 16);
        assert!(!(*i).dest_addr.is_null());
        let port = u16::from_be(*((*i).dest_addr as *const u16).add(1));
        assert_eq!(port, 4242);
        fi_freeinfo(i);
        fi_freeinfo(h);
    }
}

#[test]
fn prov_attr_only_lists_every_provider_whatever_the_hints() {
    // SAFETY: as above.
    unsafe {
        let h = fi_dupinfo(null());
        // Device memory: no provider here can answer it, but this flag lists them anyway.
        (*h).caps = FI_MSG | FI_HMEM;
        let i = getinfo(version(17), None, FI_PROV_ATTR_ONLY, h).expect("one per provider");
        let mut names = Vec::new();
        let mut p = i;
        while !p.is_null() {
            let f = &*(*p).fabric_attr;
            names.push(CStr::from_ptr(f.prov_name).to_str().unwrap().to_string());
            assert_ne!(f.prov_version, 0);
            p = (*p).next;
        }
        assert!(names.contains(&"shm".to_string()), "{names:?}");
        assert!(names.contains(&"tcp".to_string()), "{names:?}");
        let mut sorted = names.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len(), "once each: {names:?}");
        fi_freeinfo(i);
        fi_freeinfo(h);
    }
}
