//! The host-memory interface, the registry on this machine, the interfaces xfabric does not
//! implement, and `enum fi_hmem_iface` against libfabric's header.

use std::process::Command;
use std::sync::atomic::Ordering;

use xfabric_hmem::{Hmem, HmemError, HmemIface, Iface, Owner, System};

#[test]
fn system_copies_and_owns_everything() {
    let sys = System::new();
    sys.available().unwrap();
    assert_eq!(sys.devices().len(), 1);
    let src: Vec<u8> = (0..=255).collect();
    let mut dst = vec![0u8; 256];
    assert_eq!(sys.owns(dst.as_ptr()).unwrap(), Some(Owner::SYSTEM));
    // SAFETY: `dst` is host memory of 256 bytes, borrowed only here.
    unsafe { sys.copy_from_host(0, dst.as_mut_ptr(), &src).unwrap() };
    assert_eq!(dst, src);
    let mut back = vec![0u8; 256];
    // SAFETY: `dst` is host memory of 256 bytes.
    unsafe { sys.copy_to_host(0, &mut back, dst.as_ptr()).unwrap() };
    assert_eq!(back, src);
    // SAFETY: the device number is refused before anything is copied.
    let e = unsafe { sys.copy_from_host(1, dst.as_mut_ptr(), &src) }.unwrap_err();
    assert!(e.to_string().contains("only device 0"), "{e}");
    // SAFETY: registration of host memory is a no-op.
    unsafe {
        sys.host_register(dst.as_mut_ptr(), 256).unwrap();
        sys.host_unregister(dst.as_mut_ptr()).unwrap();
    }
}

#[test]
fn system_allocations_are_zeroed_pages() {
    let sys = System::new();
    let m = sys.alloc_host_mapped(0, 100).unwrap();
    assert_eq!(m.as_ptr() as usize % 4096, 0);
    assert_eq!(m.device_addr(), m.as_ptr() as u64);
    assert_eq!((m.len(), m.iface(), m.device()), (100, Iface::System, 0));
    // SAFETY: 100 bytes owned by `m`.
    assert!(unsafe { std::slice::from_raw_parts(m.as_ptr(), 100) }
        .iter()
        .all(|&b| b == 0));
    let bell = m.atomic_u64(11).unwrap();
    assert_eq!(bell.fetch_add(5, Ordering::AcqRel), 0);
    assert!(m.atomic_u64(12).is_none(), "word 12 ends past 100 bytes");
    assert!(m.atomic_u64(usize::MAX).is_none());
    m.free().unwrap();

    let d = sys.alloc_device(0, 10).unwrap();
    assert_eq!(d.addr() as usize % 4096, 0);
    drop(d);
    assert!(sys.take_drop_errors().is_empty());

    assert!(matches!(
        sys.alloc_host_mapped(0, 0),
        Err(HmemError::Inval { .. })
    ));
    assert!(matches!(
        sys.alloc_device(3, 8),
        Err(HmemError::Inval { .. })
    ));
    let e = sys.ipc_get(std::ptr::null(), 1).unwrap_err();
    assert_eq!(e.errno(), libc::EOPNOTSUPP);
}

#[test]
fn unimplemented_interfaces_say_so() {
    let hmem = Hmem::detect();
    for iface in [Iface::Rocr, Iface::Neuron, Iface::SynapseAi] {
        let i = hmem.get(iface);
        assert_eq!(i.iface(), iface);
        let u = i.available().unwrap_err();
        assert_eq!(
            u.reason,
            format!("xfabric does not implement {}", iface.c_name())
        );
        assert!(i.devices().is_empty());
        let e = i.alloc_device(0, 8).unwrap_err();
        assert_eq!(e.errno(), libc::ENOSYS);
        let core: xfabric_core::Error = e.into();
        assert!(matches!(core, xfabric_core::Error::NoSys(_)));
    }
}

/// On a machine without the drivers (this project's CI) the registry still answers: system
/// available, CUDA and Level Zero unavailable with reasons, and host memory owned by System.
#[test]
fn registry_reports_every_interface() {
    let hmem = Hmem::detect();
    let report = hmem.report();
    assert_eq!(report.len(), 6);
    for (line, iface) in report.iter().zip(Iface::ALL) {
        assert_eq!(line.iface, iface);
        println!("{line}");
    }
    assert!(report[0]
        .to_string()
        .starts_with("FI_HMEM_SYSTEM: available, 1 device(s)"));
    for line in &report[1..] {
        if let Err(u) = &line.status {
            assert!(!u.reason.is_empty());
        }
    }
    let host = [1u8; 16];
    assert_eq!(hmem.owner(host.as_ptr()).unwrap(), Owner::SYSTEM);
    let device_ifaces = hmem.device_ifaces();
    assert!(device_ifaces
        .iter()
        .all(|i| i.is_device() && i.is_implemented()));
    assert!(std::ptr::eq(Hmem::global(), Hmem::global()));
}

/// `Iface` values equal `enum fi_hmem_iface` in the installed fi_domain.h.
#[test]
fn iface_values_match_fi_domain_h() {
    if !std::path::Path::new("/usr/include/rdma/fi_domain.h").exists() {
        println!(
            "skipped: /usr/include/rdma/fi_domain.h is absent (apt-get install libfabric-dev)"
        );
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let (src, exe) = (dir.join("hmem_iface.c"), dir.join("hmem_iface"));
    let mut c = String::from("#include <stdio.h>\n#include <rdma/fabric.h>\n#include <rdma/fi_domain.h>\nint main(void) {\n");
    for i in Iface::ALL {
        c += &format!("\tprintf(\"{0} %d\\n\", (int){0});\n", i.c_name());
    }
    c += "\treturn 0;\n}\n";
    std::fs::write(&src, c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&exe).output().unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), Iface::ALL.len());
    for (line, iface) in lines.iter().zip(Iface::ALL) {
        assert_eq!(*line, format!("{} {}", iface.c_name(), iface.as_raw()));
        assert_eq!(Iface::from_raw(iface.as_raw()), Some(iface));
    }
}
