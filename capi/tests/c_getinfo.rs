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
