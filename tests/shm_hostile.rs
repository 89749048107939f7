//! Things planted in /dev/shm under our prefix by another user (or by mistake): a FIFO, a
//! symlink to a FIFO or to a regular file elsewhere, a directory, a short file, another user's
//! file. Reclaim, domain and endpoint open, and an AV insert and a send to an address naming
//! one of them return promptly: they are left alone, and a send is refused with `Inval` naming
//! the path. Then: a long-lived process reclaims, at a later endpoint open, the segment of a
//! peer that died after its first open.

mod common;
use std::ffi::CString;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use xfabric::providers::shm::segment::{reclaim_stale, PREFIX, SHM_DIR};
use xfabric::providers::shm::ADDR_PREFIX;
use xfabric::*;

const CAPS: u64 = FI_MSG | FI_TAGGED;
/// The user the planted files belong to where we may give them away (we run as root).
const NOBODY: u32 = 65534;

/// Files planted for one test, removed (without following links) when dropped.
struct Planted {
    paths: Vec<PathBuf>,
    elsewhere: Vec<PathBuf>,
    /// Files whose lock we hold, so that they look alive.
    _held: Vec<std::fs::File>,
}

impl Drop for Planted {
    fn drop(&mut self) {
        for p in &self.paths {
            // Opening a FIFO for reading and writing never blocks, and releases whoever is
            // blocked opening it (an xfabric without the fix, in this or another process).
            let meta = std::fs::symlink_metadata(p);
            if meta.is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type())) {
                let _ = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(p);
            }
        }
        for p in self.paths.iter().chain(&self.elsewhere) {
            let _ = std::fs::remove_file(p).or_else(|_| std::fs::remove_dir(p));
        }
    }
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Gives `p` (not following a symlink) to user `NOBODY` where we may (as root).
fn give_away(p: &Path) {
    if is_root() {
        // SAFETY: lchown gets a valid C string.
        let r = unsafe { libc::lchown(cpath(p).as_ptr(), NOBODY, NOBODY) };
        assert_eq!(r, 0, "lchown {}", p.display());
    }
}

/// The kinds planted by this user: another user's file only where we can make one.
fn kinds() -> impl Iterator<Item = (&'static str, &'static str)> {
    KINDS
        .into_iter()
        .filter(|(k, _)| *k != "foreign" || is_root())
}

/// Takes `p`'s lock as a live segment owner holds it, for as long as the result is open.
fn hold(p: &Path) -> std::fs::File {
    let f = std::fs::File::open(p).unwrap();
    // SAFETY: flock on a descriptor we own.
    let r = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) };
    assert_eq!(r, 0, "flock {}", p.display());
    f
}

/// Names (suffixes) of what `plant` puts in /dev/shm, with the word the refusal must contain.
const KINDS: [(&str, &str); 6] = [
    ("fifo", "FIFO"),
    ("link-fifo", "symbolic link"),
    ("link-file", "symbolic link"),
    ("dir", "directory"),
    ("short", "bytes"),
    ("foreign", "user"),
];

fn planted_name(tag: &str, kind: &str) -> String {
    format!("{PREFIX}planted-{tag}-{kind}")
}

/// Plants one of each kind under names made from `tag`.
fn plant(tag: &str) -> Planted {
    let dir = Path::new(SHM_DIR);
    let p = |k: &str| dir.join(planted_name(tag, k));
    let outside = dir.join(format!("not-xfabric-{tag}-target"));
    let mut planted = Planted {
        paths: kinds().map(|(k, _)| p(k)).collect(),
        elsewhere: vec![outside.clone()],
        _held: Vec::new(),
    };
    // SAFETY: mkfifo gets a valid C string.
    let r = unsafe { libc::mkfifo(cpath(&p("fifo")).as_ptr(), 0o666) };
    assert_eq!(r, 0, "mkfifo");
    give_away(&p("fifo"));
    std::os::unix::fs::symlink(p("fifo"), p("link-fifo")).unwrap();
    // A regular, sized, unlocked file: what reclaim would unlink, and a send would map.
    std::fs::write(&outside, vec![0u8; 1 << 20]).unwrap();
    std::os::unix::fs::symlink(&outside, p("link-file")).unwrap();
    std::fs::create_dir(p("dir")).unwrap();
    // A short file. It and the regular files below look alive (we hold their locks): our
    // reclaim must leave them for other reasons, and another process's (an older xfabric,
    // run beside this test) must not take them from under it.
    planted._held.push(locked_file(&p("short"), 64));
    if is_root() {
        planted._held.push(locked_file(&p("foreign"), 1 << 20));
        give_away(&p("foreign"));
    }
    planted._held.push(hold(&outside));
    planted
}

/// Creates `p` empty (which reclaim leaves alone as "being created"), takes its lock, and only
/// then gives it `len` bytes: a reclaim running beside (the other test of this file opens
/// endpoints) never sees it sized and unlocked.
fn locked_file(p: &Path, len: u64) -> std::fs::File {
    let f = std::fs::File::create(p).unwrap();
    // SAFETY: flock on a descriptor we own.
    let r = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) };
    assert_eq!(r, 0, "flock {}", p.display());
    f.set_len(len).unwrap();
    f
}

/// The child: everything that might block on a planted file, each checked for its outcome.
fn probe(tag: &str) {
    let removed = reclaim_stale();
    let n = node(CAPS, Progress::Manual);
    for (kind, why) in kinds() {
        let name = planted_name(tag, kind);
        assert!(!removed.contains(&name), "reclaim removed planted {name}");
        let addr = format!("{ADDR_PREFIX}{name}");
        let dst = n.add_peer(addr.as_bytes());
        let r = n.ep.tinject(b"hello", dst, 1);
        match r {
            Err(Error::Inval(m)) => {
                assert!(m.contains(&name) && m.contains(why), "{kind}: {m}")
            }
            r => panic!("{kind}: send to a planted file gave {r:?}"),
        }
    }
    // A second endpoint in the same process, and a second pass of reclaim.
    let _m = node(CAPS, Progress::Manual);
    reclaim_stale();
    say("OK");
}

#[test]
fn planted_files_neither_block_nor_get_used() {
    if let Some(tag) = std::env::var("XF_PLANT_TAG")
        .ok()
        .filter(|_| role().is_some())
    {
        return probe(&tag);
    }
    let tag = std::process::id().to_string();
    let planted = plant(&tag);
    let mut child = spawn(
        "planted_files_neither_block_nor_get_used",
        "probe",
        &[("XF_PLANT_TAG", &tag)],
    );
    let pid = child.pid();
    let c = &mut child.child;
    // A blocking open of a FIFO would hang the child forever: the bound turns that into a
    // failure (the child is killed).
    let st = bounded(pid, BOUND, "the probe (blocked on a planted file?)", || {
        c.wait()
    })
    .unwrap();
    assert!(st.success(), "probe failed: {st}");
    assert_eq!(child.hear(), "OK");
    for p in &planted.paths {
        assert!(
            std::fs::symlink_metadata(p).is_ok(),
            "{} was removed",
            p.display()
        );
    }
    assert_eq!(segments_of(pid), 0);
    drop(planted);
}

/// A child that opens an endpoint, says its pid, and waits to be killed.
fn doomed() {
    let _n = node(CAPS, Progress::Manual);
    say(&std::process::id().to_string());
    listen();
    unreachable!("this child is killed");
}

#[test]
fn later_endpoint_open_reclaims_segments_of_peers_dead_since() {
    if role().is_some() {
        return doomed();
    }
    // This long-lived process has opened its domain (and reclaimed) before the peer dies.
    let first = node(CAPS, Progress::Manual);
    let mut peer = spawn(
        "later_endpoint_open_reclaims_segments_of_peers_dead_since",
        "doomed",
        &[],
    );
    let pid: u32 = peer.hear().parse().unwrap();
    assert!(segments_of(pid) > 0);
    peer.kill();
    if segments_of(pid) == 0 {
        // Another process's open reclaimed it first: that is the behaviour under test too,
        // but then this run cannot tell whether ours would have.
        eprintln!("note: the killed child's segment was reclaimed by another process");
    }
    // Reclaim is rate-limited by time (a directory scan per open would be waste): let that
    // pass. Not a race: the monotonic clock has moved on 1.1 s whatever the load.
    std::thread::sleep(Duration::from_millis(1100));
    let _second = first.domain.endpoint(&first.info).expect("endpoint");
    assert_eq!(
        segments_of(pid),
        0,
        "a new endpoint did not reclaim the dead peer's segment"
    );
}

/// A file system mounted over a name under our prefix whose server never answers (an
/// ordinary user makes one with fusermount3 over a regular file of theirs on /dev/shm): reclaim,
/// an endpoint's open, and a send naming it return promptly, the send refused with `Inval`
/// naming the mount. Before, each looked at the name (`lstat`, `open`), a request into the
/// file system that waited for an answer forever. Run in a child with a mount namespace and a
/// /dev/shm of its own (root only; skipped where the kernel gives neither, or no FUSE).
#[test]
fn a_file_system_mounted_over_a_planted_name_is_never_entered() {
    const T: &str = "a_file_system_mounted_over_a_planted_name_is_never_entered";
    if role().is_some_and(|r| r == "fuse") {
        return fuse_probe();
    }
    if role().is_some() {
        return;
    }
    if !is_root() {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let mut child = spawn(T, "fuse", &[]);
    let pid = child.pid();
    let c = &mut child.child;
    let st = bounded(
        pid,
        BOUND,
        "the probe (blocked in the mounted file?)",
        || c.wait(),
    )
    .unwrap();
    assert!(st.success(), "probe failed: {st}");
    let line = child.hear();
    if let Some(why) = line.strip_prefix("skip: ") {
        eprintln!("skipped: {why}");
        return;
    }
    assert_eq!(line, "OK");
}

/// The child of the test above: a private /dev/shm, a FUSE mount nobody serves over a file
/// named as a segment, then every way xfabric looks at such names.
fn fuse_probe() {
    use std::os::fd::AsRawFd;
    let os = || std::io::Error::last_os_error();
    // SAFETY (each call): plain system calls with valid NUL-terminated arguments; results
    // checked.
    unsafe {
        if libc::unshare(libc::CLONE_NEWNS) != 0 {
            return say(&format!("skip: unshare(CLONE_NEWNS): {}", os()));
        }
        let (none, root) = (std::ptr::null(), c"/".as_ptr());
        if libc::mount(
            none,
            root,
            none,
            libc::MS_REC | libc::MS_PRIVATE,
            none.cast(),
        ) != 0
        {
            return say(&format!("skip: making mounts private: {}", os()));
        }
        let opts = c"mode=1777";
        if libc::mount(
            c"tmpfs".as_ptr(),
            c"/dev/shm".as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            opts.as_ptr().cast(),
        ) != 0
        {
            return say(&format!("skip: a tmpfs on /dev/shm: {}", os()));
        }
    }
    let name = format!(
        "{}fuse-{}",
        xfabric::providers::shm::segment::PREFIX,
        std::process::id()
    );
    let path = Path::new(SHM_DIR).join(&name);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .expect("the file to mount over");
    let fuse = match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
    {
        Ok(f) => f,
        Err(e) => return say(&format!("skip: /dev/fuse: {e}")),
    };
    let data = CString::new(format!(
        "fd={},rootmode=100000,user_id=0,group_id=0",
        fuse.as_raw_fd()
    ))
    .unwrap();
    // SAFETY: valid NUL-terminated arguments; the result is checked.
    let r = unsafe {
        libc::mount(
            c"xfabric-test".as_ptr(),
            cpath(&path).as_ptr(),
            c"fuse".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if r != 0 {
        return say(&format!("skip: mounting FUSE: {}", os()));
    }
    // Nothing reads `fuse`: every request into the mount waits for good (until this process
    // exits, which ends the connection and, with it, the mount namespace).
    let removed = reclaim_stale();
    assert!(!removed.contains(&name), "reclaim removed the mounted name");
    let n = node(CAPS, Progress::Manual);
    let dst = n.add_peer(format!("{ADDR_PREFIX}{name}").as_bytes());
    match n.ep.tinject(b"hello", dst, 1) {
        Err(Error::Inval(m)) => assert!(m.contains(&name) && m.contains("mount"), "{m}"),
        r => panic!("a send to the mounted name gave {r:?}"),
    }
    say("OK");
    drop(fuse);
}
