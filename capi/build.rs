// Links the cdylib as a drop-in libfabric.so.1: Debian's soname and version nodes, so that
// programs linked against Debian's library resolve their versioned symbols here.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=fabric.map");
    println!("cargo:rerun-if-changed=build.rs");
    // rustc's default linker here is lld, which records the nodes but not their parents; GNU ld
    // cannot be used instead, it rejects rustc's own anonymous version script next to this one.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libfabric.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/fabric.map");
}
