//! The environment settings xfabric reads, in one table: name, default and meaning.
//! `xfabric info -e` prints it as `fi_info -e` prints libfabric's parameters. The readers
//! still live next to the code they tune; this table is what users are told about them.

/// One environment setting: what libfabric describes with a `struct fi_param`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The environment variable.
    pub name: &'static str,
    /// Shown as fi_info shows a parameter's type.
    pub kind: &'static str,
    /// What applies when the variable is unset (or does not parse).
    pub default: &'static str,
    /// What the setting changes, in a sentence or two.
    pub meaning: &'static str,
}

/// Every setting the library reads today.
pub const SETTINGS: &[Setting] = &[
    Setting {
        name: "XFABRIC_XPU_SPIN_MS",
        kind: "size_t",
        default: "20",
        meaning: "After an XPU-triggered operation is armed or fires, how long (ms) the \
                  watcher polls doorbells without sleeping",
    },
    Setting {
        name: "XFABRIC_XPU_POLL_US",
        kind: "size_t",
        default: "1000",
        meaning: "Past the spin window, how long (us) the watcher sleeps between looks at a \
                  doorbell that armed operations wait on",
    },
    Setting {
        name: "XFABRIC_SHM_CMA",
        kind: "Boolean (0/1)",
        default: "1",
        meaning: "0 turns off cross-memory attach (process_vm_readv) for large shm transfers; \
                  anything else lets the provider try it",
    },
    Setting {
        name: "XFABRIC_SHM_SPLIT_MIN",
        kind: "size_t",
        default: "65536",
        meaning: "Smallest shm message (bytes) whose copy is split between sender and receiver",
    },
    Setting {
        name: "XFABRIC_ZE_LOADER",
        kind: "String",
        default: "libze_loader.so.1",
        meaning: "The Level Zero loader library opened for FI_HMEM_ZE",
    },
    Setting {
        name: "XDG_CACHE_HOME",
        kind: "String",
        default: "$HOME/.cache",
        meaning: "Where xfabric-kernels caches compiled PTX (under xfabric/kernels)",
    },
];
