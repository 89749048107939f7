//! The environment settings xfabric reads: one table (name, type, default, meaning) and the one
//! reader. `xfabric info -e` prints the table as `fi_info -e` prints libfabric's parameters.
//!
//! Each setting is read from the environment once, on first use, and kept: a value changed
//! later in the process's life is not seen, as libfabric reads its parameters once. The default
//! lives only here, as the text the table shows; a size's default is that text parsed. A value
//! that does not parse is reported once, naming the variable, the text and the default used
//! instead, and the default applies.

use std::fmt;
use std::sync::OnceLock;

/// The type of a setting, shown as fi_info shows a parameter's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A non-negative integer, in the unit the meaning names.
    Size,
    /// `0` or `1`.
    Bool,
    /// Any UTF-8 text.
    Str,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Size => "size_t",
            Kind::Bool => "Boolean (0/1)",
            Kind::Str => "String",
        })
    }
}

/// One environment setting: what libfabric describes with a `struct fi_param`.
#[derive(Debug)]
pub struct Setting {
    /// The environment variable.
    pub name: &'static str,
    /// Its type, shown as fi_info shows a parameter's type.
    pub kind: Kind,
    /// What applies when the variable is unset or does not parse.
    pub default: &'static str,
    /// What the setting changes, in a sentence or two.
    pub meaning: &'static str,
    value: OnceLock<Value>,
}

#[derive(Debug)]
enum Value {
    Size(u64),
    Bool(bool),
    Str(Option<String>),
}

impl Setting {
    const fn new(
        name: &'static str,
        kind: Kind,
        default: &'static str,
        meaning: &'static str,
    ) -> Self {
        Setting {
            name,
            kind,
            default,
            meaning,
            value: OnceLock::new(),
        }
    }

    /// A size setting's value: the environment's, or the default.
    pub fn size(&self) -> u64 {
        match self.value() {
            Value::Size(v) => *v,
            _ => wrong_kind(self, Kind::Size, parse_size(self.default).unwrap_or(0)),
        }
    }

    /// As [`Setting::size`], saturated to `usize`.
    pub fn usize(&self) -> usize {
        usize::try_from(self.size()).unwrap_or(usize::MAX)
    }

    /// A Boolean setting's value: the environment's, or the default.
    pub fn flag(&self) -> bool {
        match self.value() {
            Value::Bool(v) => *v,
            _ => wrong_kind(self, Kind::Bool, parse_bool(self.default).unwrap_or(false)),
        }
    }

    /// A text setting's value when the environment sets one; `None` means the default, which
    /// for some (`$HOME/.cache`, "all providers") is a description rather than a value.
    pub fn text(&self) -> Option<&str> {
        match self.value() {
            Value::Str(v) => v.as_deref(),
            _ => wrong_kind(self, Kind::Str, None),
        }
    }

    /// A text setting's value, or its default text.
    pub fn text_or_default(&self) -> &str {
        self.text().unwrap_or(self.default)
    }

    fn value(&self) -> &Value {
        self.value.get_or_init(|| {
            let raw = std::env::var_os(self.name);
            let (value, bad) = interpret(self, raw.as_ref().map(|r| r.to_string_lossy()));
            if let Some(why) = bad {
                warn_bad(&why);
            }
            value
        })
    }
}

/// A typed accessor used on a setting of another type: a bug in xfabric, not in the
/// environment. Debug builds say so; release builds use the default.
fn wrong_kind<T>(s: &Setting, asked: Kind, fallback: T) -> T {
    debug_assert!(false, "{} is a {}, read as a {asked}", s.name, s.kind);
    fallback
}

/// The value `raw` gives `s`, and, when it does not parse, the warning that says so.
fn interpret(s: &Setting, raw: Option<std::borrow::Cow<'_, str>>) -> (Value, Option<String>) {
    let bad = |what: &str| {
        Some(format!(
            "{}={:?} is not {what}: using the default {}",
            s.name,
            raw.as_deref().unwrap_or(""),
            s.default
        ))
    };
    match s.kind {
        Kind::Size => {
            let default = parse_size(s.default).unwrap_or(0);
            match raw.as_deref().map(parse_size) {
                None => (Value::Size(default), None),
                Some(Some(v)) => (Value::Size(v), None),
                Some(None) => (Value::Size(default), bad("a non-negative integer")),
            }
        }
        Kind::Bool => {
            let default = parse_bool(s.default).unwrap_or(false);
            match raw.as_deref().map(parse_bool) {
                None => (Value::Bool(default), None),
                Some(Some(v)) => (Value::Bool(v), None),
                Some(None) => (Value::Bool(default), bad("0 or 1")),
            }
        }
        Kind::Str => match raw {
            // to_string_lossy put U+FFFD where the bytes were not UTF-8.
            Some(ref v) if v.contains('\u{FFFD}') => (Value::Str(None), bad("UTF-8")),
            Some(v) => (Value::Str(Some(v.into_owned())), None),
            None => (Value::Str(None), None),
        },
    }
}

fn parse_size(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

fn parse_bool(text: &str) -> Option<bool> {
    match text.trim() {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    }
}

/// Reports a bad value through `tracing`, and on stderr as well when no logger is installed:
/// logging is off unless asked for (FI_LOG_LEVEL, RUST_LOG), and a user who mistyped a setting
/// must learn that it was ignored without first knowing how to turn logging on.
fn warn_bad(why: &str) {
    if !tracing::dispatcher::has_been_set() {
        eprintln!("xfabric: warning: {why}");
    }
    tracing::warn!("{why}");
}

/// `XFABRIC_XPU_SPIN_MS`: After an XPU-triggered operation is armed or fires, how long (ms) the
/// watcher polls doorbells without sleeping.
pub static XPU_SPIN_MS: Setting = Setting::new(
    "XFABRIC_XPU_SPIN_MS",
    Kind::Size,
    "20",
    "After an XPU-triggered operation is armed or fires, how long (ms) the watcher polls \
     doorbells without sleeping",
);
/// `XFABRIC_XPU_POLL_US`: Past the spin window, how long (us) the watcher sleeps between looks at a
/// doorbell that armed operations wait on; 0 makes it spin instead (a core given to the watcher).
pub static XPU_POLL_US: Setting = Setting::new(
    "XFABRIC_XPU_POLL_US",
    Kind::Size,
    "1000",
    "Past the spin window, how long (us) the watcher sleeps between looks at a doorbell that \
     armed operations wait on; 0 makes it spin instead (a core given to the watcher)",
);
/// `XFABRIC_XPU_POLL_MAX_US`: After a long quiet (no arm, ring or post for 256 ms and more), the
/// watcher's periodic looks space out from XFABRIC_XPU_POLL_US, doubling each time the quiet
/// doubles, up to this (us); at most XFABRIC_XPU_POLL_US keeps them fixed.
pub static XPU_POLL_MAX_US: Setting = Setting::new(
    "XFABRIC_XPU_POLL_MAX_US",
    Kind::Size,
    "8000",
    "After a long quiet (no arm, ring or post for 256 ms and more), the watcher's periodic looks \
     space out from XFABRIC_XPU_POLL_US, doubling each time the quiet doubles, up to this (us); \
     at most XFABRIC_XPU_POLL_US keeps them fixed",
);
/// `XFABRIC_XPU_CPU_SPIN_US`: The spin window (us) instead, when every doorbell of the endpoint
/// belongs to a CPU XPU, whose ring wakes a sleeping watcher.
pub static XPU_CPU_SPIN_US: Setting = Setting::new(
    "XFABRIC_XPU_CPU_SPIN_US",
    Kind::Size,
    "50",
    "The spin window (us) instead, when every doorbell of the endpoint belongs to a CPU XPU, \
     whose ring wakes a sleeping watcher",
);
/// `XFABRIC_XPU_PREDICT`: 1 lets the watcher learn when each doorbell that wakes no one (a GPU's)
/// rings, sleep until shortly before the next ring is due and spin from there; 0 keeps the spin
/// window then a look per XFABRIC_XPU_POLL_US.
pub static XPU_PREDICT: Setting = Setting::new(
    "XFABRIC_XPU_PREDICT",
    Kind::Bool,
    "1",
    "1 lets the watcher learn when each doorbell that wakes no one (a GPU's) rings, sleep until \
     shortly before the next ring is due and spin from there; 0 keeps the spin window then a \
     look per XFABRIC_XPU_POLL_US",
);
/// `XFABRIC_XPU_MARGIN_US`: How long (us) before a doorbell's predicted ring the watcher starts
/// to spin, and after it keeps spinning, at the least; twice the rings' observed jitter is added,
/// and the sum doubles after each ring outside it.
pub static XPU_MARGIN_US: Setting = Setting::new(
    "XFABRIC_XPU_MARGIN_US",
    Kind::Size,
    "200",
    "How long (us) before a doorbell's predicted ring the watcher starts to spin, and after it \
     keeps spinning, at the least; twice the rings' observed jitter is added, and the sum \
     doubles after each ring outside it",
);
/// `XFABRIC_XPU_MAX_SPIN_US`: Longest (us) the watcher spins for one predicted ring before it
/// falls back to a look per XFABRIC_XPU_POLL_US.
pub static XPU_MAX_SPIN_US: Setting = Setting::new(
    "XFABRIC_XPU_MAX_SPIN_US",
    Kind::Size,
    "5000",
    "Longest (us) the watcher spins for one predicted ring before it falls back to a look per \
     XFABRIC_XPU_POLL_US",
);
/// `XFABRIC_XPU_PREARM`: 1 lets a provider that can (shm) make an XPU-triggered send ready when
/// it is armed, so that its firing only releases it to the peer; 0 starts every one as a post
/// when it fires.
pub static XPU_PREARM: Setting = Setting::new(
    "XFABRIC_XPU_PREARM",
    Kind::Bool,
    "1",
    "1 lets a provider that can (shm) make an XPU-triggered send ready when it is armed, so \
     that its firing only releases it to the peer; 0 starts every one as a post when it fires",
);
/// `XFABRIC_SHM_CMA`: 0 turns off cross-memory attach (process_vm_readv) for large shm transfers; 1
/// lets the provider try it.
pub static SHM_CMA: Setting = Setting::new(
    "XFABRIC_SHM_CMA",
    Kind::Bool,
    "1",
    "0 turns off cross-memory attach (process_vm_readv) for large shm transfers; 1 lets the \
     provider try it",
);
/// `XFABRIC_SHM_CMA_MIN`: Smallest shm message, RMA write or read (bytes) that offers its memory
/// for the other side to copy by cross-memory attach; smaller ones cross the ring. Messages
/// only past the eager limit (32 KiB) are offered at all: by default every one of them is
/// (measured 2026-11-30, pinned: 96 KiB 16-19 -> 8.3 us a one-way trip, 128 KiB 20-25 ->
/// 9.9, where streaming through the ring also fell into a mode twice as slow now and then).
pub static SHM_CMA_MIN: Setting = Setting::new(
    "XFABRIC_SHM_CMA_MIN",
    Kind::Size,
    "32768",
    "Smallest shm message, RMA write or read (bytes) that offers its memory for the other side \
     to copy by cross-memory attach; smaller ones cross the ring",
);
/// `XFABRIC_SHM_MAP_MIN`: Smallest shm message or RMA write (bytes) from memory allocated to be
/// shared (hmem's device-visible host memory) that offers it for the receiver to copy from a
/// mapping, instead of sending it eagerly through the ring.
pub static SHM_MAP_MIN: Setting = Setting::new(
    "XFABRIC_SHM_MAP_MIN",
    Kind::Size,
    "16384",
    "Smallest shm message or RMA write (bytes) from shared host memory (alloc_host_mapped) that \
     the receiver copies from a mapping of the sender's memory instead of through the ring",
);
/// `XFABRIC_SHM_IPC_MIN`: Smallest shm send (bytes) from CUDA device memory that is offered to
/// the receiver to copy by CUDA IPC (device to device, or device to host) instead of staged
/// through host bounce buffers. Below it, staging. The crossover is to be measured on a GPU
/// machine; until then the default keeps every eager-sized message staged.
pub static SHM_IPC_MIN: Setting = Setting::new(
    "XFABRIC_SHM_IPC_MIN",
    Kind::Size,
    "65536",
    "Smallest shm send (bytes) from CUDA device memory that the receiver copies by CUDA IPC \
     instead of through host staging buffers",
);
/// `XFABRIC_SHM_SPLIT_MIN`: Smallest shm message (bytes) whose cross-memory-attach copy is split
/// between sender and receiver (only copies from `XFABRIC_SHM_CMA_MIN` on exist).
pub static SHM_SPLIT_MIN: Setting = Setting::new(
    "XFABRIC_SHM_SPLIT_MIN",
    Kind::Size,
    "65536",
    "Smallest shm message (bytes) whose copy is split between sender and receiver",
);
/// `XFABRIC_SHM_UNEXP_MSGS`: Unexpected messages an shm endpoint buffers at most; past that a new
/// one stays in its sender's ring until a receive is posted.
pub static SHM_UNEXP_MSGS: Setting = Setting::new(
    "XFABRIC_SHM_UNEXP_MSGS",
    Kind::Size,
    "16384",
    "Unexpected messages an shm endpoint buffers at most; past that a new one stays in its \
     sender's ring until a receive is posted",
);
/// `XFABRIC_SHM_UNEXP_BYTES`: Bytes the buffered unexpected messages of one shm endpoint may hold.
pub static SHM_UNEXP_BYTES: Setting = Setting::new(
    "XFABRIC_SHM_UNEXP_BYTES",
    Kind::Size,
    "33554432",
    "Bytes the buffered unexpected messages of one shm endpoint may hold",
);
/// `XFABRIC_SHM_HELD_BYTES`: Bytes the frames an shm endpoint holds from one peer past its
/// unexpected bounds (copied out of the peer's ring, in order) may take; past that the next
/// frame stays in the ring.
pub static SHM_HELD_BYTES: Setting = Setting::new(
    "XFABRIC_SHM_HELD_BYTES",
    Kind::Size,
    "8388608",
    "Bytes the frames an shm endpoint holds from one peer past its unexpected bounds may \
     take; past that the next frame stays in the peer's ring",
);
/// `XFABRIC_TCP_EAGER_MAX`: Largest message a tcp endpoint sends eagerly; larger ones wait for
/// the receiver to match them (at most 1 MiB).
pub static TCP_EAGER_MAX: Setting = Setting::new(
    "XFABRIC_TCP_EAGER_MAX",
    Kind::Size,
    "65536",
    "Largest message a tcp endpoint sends eagerly; larger ones wait for the receiver to match \
     them (at most 1 MiB)",
);
/// `XFABRIC_VERBS_NATIVE`: Whether RMA and atomics on regions the NIC knows go through the
/// NIC (RDMA write, read, atomics); 0: through frames, executed by the target's CPU.
pub static VERBS_NATIVE: Setting = Setting::new(
    "XFABRIC_VERBS_NATIVE",
    Kind::Bool,
    "1",
    "Whether RMA and atomics on regions the NIC knows go through the NIC (RDMA write, read, \
     atomics); 0: through frames, executed by the target's CPU",
);
/// `XFABRIC_VERBS_NATIVE_ATOMICS`: Whether the atomics the NIC has (a 64-bit `FI_SUM`,
/// `FI_ATOMIC_READ` or `FI_CSWAP` of one element) go through it when `XFABRIC_VERBS_NATIVE`
/// lets them and the link is quiet. Off by default: the target's CPU executes every other
/// atomic, and these too when the link is busy, and a NIC's atomic is not atomic with the
/// CPU's, so two processes updating one word could lose an update. On, an application whose
/// words are only ever updated by those three operations gets the NIC's.
pub static VERBS_NATIVE_ATOMICS: Setting = Setting::new(
    "XFABRIC_VERBS_NATIVE_ATOMICS",
    Kind::Bool,
    "0",
    "1: the atomics the NIC has (64-bit FI_SUM, FI_ATOMIC_READ, FI_CSWAP of one element) go \
     through it while the link is quiet, then not atomic with the ones the target's CPU \
     executes; 0: every atomic through the engine's frames",
);
/// `XFABRIC_VERBS_PULL_MIN`: Messages of at least this many bytes (and above the eager
/// limit) are read by the receiver's NIC (RDMA read) from the sender's memory instead of
/// moving as chunks; 0: never.
pub static VERBS_PULL_MIN: Setting = Setting::new(
    "XFABRIC_VERBS_PULL_MIN",
    Kind::Size,
    "65536",
    "Messages of at least this many bytes (and above the eager limit) are read by the \
     receiver's NIC (RDMA read) from the sender's memory instead of moving as chunks; 0: never",
);
/// `XFABRIC_TCP_UNEXP_MSGS`: Unexpected messages one tcp endpoint buffers before it stops
/// reading the peer that sends more.
pub static TCP_UNEXP_MSGS: Setting = Setting::new(
    "XFABRIC_TCP_UNEXP_MSGS",
    Kind::Size,
    "16384",
    "Unexpected messages one tcp endpoint buffers before it stops reading the peer that sends \
     more",
);
/// `XFABRIC_TCP_UNEXP_BYTES`: Bytes the buffered unexpected messages of one tcp endpoint may hold.
pub static TCP_UNEXP_BYTES: Setting = Setting::new(
    "XFABRIC_TCP_UNEXP_BYTES",
    Kind::Size,
    "33554432",
    "Bytes the buffered unexpected messages of one tcp endpoint may hold",
);
/// `XFABRIC_TCP_UNEXP_PEER_BYTES`: Bytes of buffered unexpected messages (and bodies still
/// arriving) one peer of a tcp endpoint may hold.
pub static TCP_UNEXP_PEER_BYTES: Setting = Setting::new(
    "XFABRIC_TCP_UNEXP_PEER_BYTES",
    Kind::Size,
    "8388608",
    "Bytes of buffered unexpected messages, and of bodies still arriving, that one peer of a \
     tcp endpoint may hold; past it that peer is not read until a receive takes one",
);
/// `XFABRIC_AUTH_KEY`: The authentication key of tcp endpoints whose domain gives none
/// (`domain_attr->auth_key`): peers prove they hold the same one before anything they send
/// is taken.
pub static AUTH_KEY: Setting = Setting::new(
    "XFABRIC_AUTH_KEY",
    Kind::Str,
    "none",
    "Authentication key of tcp endpoints whose domain gives none (domain_attr->auth_key): a \
     peer must prove it holds the same key (HMAC-SHA-256 challenge) before anything it sends \
     is taken; endpoints with different keys cannot talk. Not encryption",
);
/// `XFABRIC_TCP_DEAD_MS`: Milliseconds a connected tcp peer may acknowledge nothing we sent
/// (data, or the kernel's probes) before it is declared lost (0: leave it to the kernel).
pub static TCP_DEAD_MS: Setting = Setting::new(
    "XFABRIC_TCP_DEAD_MS",
    Kind::Size,
    "30000",
    "Milliseconds a connected tcp peer may acknowledge nothing we sent (data, or the \
     kernel's keepalive and zero-window probes) before it is declared lost and its \
     operations fail; a peer holding our data back while its kernel answers is alive \
     however long it holds (0: leave it to the kernel, which may wait forever on an idle \
     connection)",
);
/// `XFABRIC_TCP_STALL_MS`: Milliseconds a tcp peer may send nothing more of a frame it began
/// before it is declared lost (0: never).
pub static TCP_STALL_MS: Setting = Setting::new(
    "XFABRIC_TCP_STALL_MS",
    Kind::Size,
    "600000",
    "Milliseconds a tcp peer may send nothing more of a frame it began (a body announced and \
     not finished) before it is declared lost and its operations fail: until then the frame \
     holds the receive it matched and the bytes charged to the peer. Long, because a peer \
     under manual progress writes the rest only when its application calls progress. A frame \
     bringing less than 64 KiB in four times this, however steadily its bytes come, is lost \
     too (0: never)",
);
/// `XFABRIC_ZE_LOADER`: The Level Zero loader library opened for FI_HMEM_ZE.
pub static ZE_LOADER: Setting = Setting::new(
    "XFABRIC_ZE_LOADER",
    Kind::Str,
    "libze_loader.so.1",
    "The Level Zero loader library opened for FI_HMEM_ZE",
);
/// `XDG_CACHE_HOME`: Where xfabric-kernels caches compiled PTX (under xfabric/kernels).
pub static XDG_CACHE_HOME: Setting = Setting::new(
    "XDG_CACHE_HOME",
    Kind::Str,
    "$HOME/.cache",
    "Where xfabric-kernels caches compiled PTX (under xfabric/kernels)",
);
/// `FI_PROVIDER`: Providers getinfo may return: PROV1,PROV2 admits only those, ^PROV1,PROV2 all but
/// those.
pub static FI_PROVIDER: Setting = Setting::new(
    "FI_PROVIDER",
    Kind::Str,
    "all providers",
    "Providers getinfo may return: PROV1,PROV2 admits only those, ^PROV1,PROV2 all but those",
);
/// `FI_LOG_LEVEL`: Logs xfabric's events at this level and above to stderr: warn, info, debug or
/// trace (wins over RUST_LOG).
pub static FI_LOG_LEVEL: Setting = Setting::new(
    "FI_LOG_LEVEL",
    Kind::Str,
    "off",
    "Logs xfabric's events at this level and above to stderr: warn, info, debug or trace \
     (wins over RUST_LOG)",
);
/// `RUST_LOG`: Logs xfabric's events to stderr, filtered in tracing's target syntax
/// (xfabric_providers=debug,warn).
pub static RUST_LOG: Setting = Setting::new(
    "RUST_LOG",
    Kind::Str,
    "off",
    "Logs xfabric's events to stderr, filtered in tracing's target syntax \
     (xfabric_providers=debug,warn)",
);
/// `XFABRIC_GPU_TESTS`: Read when building, not at run time: 1 compiles the GPU tests in, to
/// require a GPU rather than be reported as ignored.
pub static GPU_TESTS: Setting = Setting::new(
    "XFABRIC_GPU_TESTS",
    Kind::Bool,
    "0",
    "Read when building, not at run time: 1 compiles the GPU tests in, to require a GPU rather \
     than be reported as ignored",
);

/// Every setting xfabric reads.
pub static SETTINGS: &[&Setting] = &[
    &XPU_SPIN_MS,
    &XPU_POLL_US,
    &XPU_POLL_MAX_US,
    &XPU_CPU_SPIN_US,
    &XPU_PREDICT,
    &XPU_MARGIN_US,
    &XPU_MAX_SPIN_US,
    &XPU_PREARM,
    &SHM_CMA,
    &SHM_CMA_MIN,
    &SHM_MAP_MIN,
    &SHM_IPC_MIN,
    &SHM_SPLIT_MIN,
    &SHM_UNEXP_MSGS,
    &SHM_UNEXP_BYTES,
    &SHM_HELD_BYTES,
    &TCP_EAGER_MAX,
    &TCP_DEAD_MS,
    &TCP_STALL_MS,
    &TCP_UNEXP_MSGS,
    &TCP_UNEXP_BYTES,
    &TCP_UNEXP_PEER_BYTES,
    &AUTH_KEY,
    &VERBS_NATIVE,
    &VERBS_NATIVE_ATOMICS,
    &VERBS_PULL_MIN,
    &ZE_LOADER,
    &XDG_CACHE_HOME,
    &FI_PROVIDER,
    &FI_LOG_LEVEL,
    &RUST_LOG,
    &GPU_TESTS,
];

#[cfg(test)]
mod tests {
    use super::*;
    use std::borrow::Cow;

    fn read(s: &Setting, raw: Option<&str>) -> (Value, Option<String>) {
        interpret(s, raw.map(Cow::Borrowed))
    }

    #[test]
    fn every_default_parses_as_its_kind() {
        for s in SETTINGS {
            let ok = match s.kind {
                Kind::Size => parse_size(s.default).is_some(),
                Kind::Bool => parse_bool(s.default).is_some(),
                Kind::Str => true,
            };
            assert!(
                ok,
                "{}'s default {:?} is not a {}",
                s.name, s.default, s.kind
            );
        }
    }

    #[test]
    fn names_are_unique() {
        for (i, a) in SETTINGS.iter().enumerate() {
            assert!(
                SETTINGS[i + 1..].iter().all(|b| b.name != a.name),
                "{}",
                a.name
            );
        }
    }

    #[test]
    fn unset_gives_the_default_without_a_warning() {
        assert!(matches!(
            read(&SHM_SPLIT_MIN, None),
            (Value::Size(65536), None)
        ));
        assert!(matches!(read(&SHM_CMA, None), (Value::Bool(true), None)));
        assert!(matches!(read(&ZE_LOADER, None), (Value::Str(None), None)));
    }

    #[test]
    fn a_good_value_is_used() {
        assert!(matches!(
            read(&SHM_SPLIT_MIN, Some("4096")),
            (Value::Size(4096), None)
        ));
        assert!(matches!(
            read(&SHM_CMA, Some("0")),
            (Value::Bool(false), None)
        ));
        let (v, bad) = read(&ZE_LOADER, Some("/x/libze.so"));
        assert!(matches!(v, Value::Str(Some(ref p)) if p == "/x/libze.so") && bad.is_none());
    }

    #[test]
    fn a_bad_value_names_the_variable_the_text_and_the_default() {
        let (v, bad) = read(&SHM_SPLIT_MIN, Some("lots"));
        assert!(matches!(v, Value::Size(65536)));
        let why = bad.expect("a warning");
        for part in ["XFABRIC_SHM_SPLIT_MIN", "\"lots\"", "65536"] {
            assert!(why.contains(part), "{part} not in {why}");
        }
        let (v, bad) = read(&SHM_CMA, Some("no"));
        assert!(matches!(v, Value::Bool(true)));
        assert!(bad.expect("a warning").contains("XFABRIC_SHM_CMA=\"no\""));
        let (v, bad) = read(&XPU_SPIN_MS, Some("-5"));
        assert!(matches!(v, Value::Size(20)) && bad.is_some());
        let (v, bad) = read(&FI_PROVIDER, Some("shm\u{FFFD}"));
        assert!(matches!(v, Value::Str(None)) && bad.is_some());
    }
}
