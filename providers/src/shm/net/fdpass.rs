//! The file descriptor of a CUDA virtual-memory-management allocation, passed to a peer over
//! a Unix socket (SCM_RIGHTS), for `ipc`'s VMM descriptors: such memory has no
//! `cuIpcGetMemHandle` handle, only a descriptor (`cuMemExportToShareableHandle`), and a
//! descriptor means nothing in another process unless passed to it.
//!
//! Each endpoint that takes CUDA IPC (`FI_HMEM`, CUDA available) listens on a
//! `SOCK_SEQPACKET` socket in the abstract namespace named after its segment
//! (`\0xfabric-fd/<segment>`; peers must share the network namespace, as for `fdwake`).
//!
//! The sender, describing VMM memory to a peer, connects to the peer's socket (non-blocking:
//! a full backlog fails at once), checks that the listener is that peer (its `SO_PEERCRED`
//! pid is the pid the sender verified for the peer by cross-memory attach: anyone could have
//! bound the name, and a descriptor of our device memory must not go to them), and, a pid
//! being reusable, that it is that very process (`Verified`: the pidfd opened when the pid
//! was verified has not exited, and where pidfds have identities of their own, Linux 6.9's
//! pidfs, the listener's `SO_PEERPIDFD` names the same process), sends one
//! message, `magic:u32 | alloc_id:u64` with the descriptor, and closes. It does this before
//! the announcement that names the allocation is written to the peer's ring, so when the
//! receiver reads the announcement the message is already queued on its socket: the
//! receiver takes what is queued and never waits.
//!
//! The receiver, when a VMM descriptor names an allocation it has not mapped, accepts what is
//! queued (the listener and every accepted connection non-blocking), keeps only connections
//! whose `SO_PEERCRED` pid is one of its peers' verified pids (a claim inside the message
//! would be no identity), reads exactly one message of exactly that form with exactly one
//! descriptor (anything else is closed and counted), and holds the descriptor under (pid,
//! allocation id) until an announcement names it. A connection accepted before its message
//! came (a look between the sender's connect and its send) is read again at later looks, for
//! `UNREAD_AGE` at most. What a peer makes it hold is bounded:
//! `PER_PID_MAX` descriptors per peer (the oldest closed first), `ACCEPT_MAX` connections
//! taken per look, and a lost peer's descriptors close with it.
//!
//! Closing the last descriptor of a file may wait on what the file is (a socket with
//! `SO_LINGER` whose queue cannot drain, a file whose filesystem answers its flush late or
//! never), and anyone who can connect chooses what it passes, its identity unchecked until
//! after: every accepted connection and every descriptor that came over one is closed on the
//! process's closer thread (`Foreign`, `close_later`), never on the caller's. While more than
//! `CLOSING_MAX` wait there (a closer stuck on such files), no more connections are accepted.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Descriptors taken from peers, in every endpoint of this process.
pub static TAKEN: AtomicU64 = AtomicU64::new(0);
/// Connections and messages refused (not a peer's, malformed), in every endpoint.
pub static REFUSED: AtomicU64 = AtomicU64::new(0);
/// Connections from peers whose descriptors are no longer kept (`Verdict::Discard`), closed
/// unread, in every endpoint.
pub static DISCARDED: AtomicU64 = AtomicU64::new(0);

/// What an inbox does with a connection, by its `SO_PEERCRED` pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A peer's: its message is read and its descriptor kept.
    Keep,
    /// A peer whose descriptors would never be used (the endpoint copies no more from it):
    /// closed unread (the descriptor in it closes with it), quietly, counted in `DISCARDED`.
    Discard,
    /// No peer's: closed, counted in `REFUSED` and logged.
    Refuse,
}

/// First word of a message.
const MAGIC: u32 = u32::from_le_bytes(*b"XFVF");
/// Its length: magic, allocation id.
const MSG_LEN: usize = 12;
/// Descriptors one peer may have waiting.
pub const PER_PID_MAX: usize = 16;
/// Connections taken per look (the rest wait for the next).
const ACCEPT_MAX: usize = 64;
/// The listener's backlog.
const BACKLOG: i32 = 64;
/// Connections from a peer whose message had not come when they were accepted (a look between
/// the sender's connect and its send), kept to be read at later looks: at most this many per
/// peer (one peer's cannot push out another's) ...
const UNREAD_MAX: usize = 4;
/// ... and for at most this long, after which the sender is taken to have given up.
const UNREAD_AGE: std::time::Duration = std::time::Duration::from_secs(1);

/// The socket address of the endpoint whose segment is `seg`, or `None` when the name is
/// too long for one.
fn addr_of(seg: &str) -> Option<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = format!("xfabric-fd/{seg}");
    // Byte 0 stays NUL: the abstract namespace, no file on disk.
    if name.len() + 1 > a.sun_path.len() {
        return None;
    }
    for (d, &b) in a.sun_path[1..].iter_mut().zip(name.as_bytes()) {
        *d = b as libc::c_char;
    }
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + 1 + name.len();
    Some((a, len as libc::socklen_t))
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", std::io::Error::last_os_error())
}

fn socket() -> Result<OwnedFd, String> {
    // SAFETY: no pointer arguments; a negative return is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        )
    };
    if fd < 0 {
        return Err(os_err("socket"));
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Socket option `opt` (`SOL_SOCKET` level) of `fd`, a value of exactly `T`'s size.
///
/// `T` must be plain data, valid all zeroes (a `ucred`, an `int`).
fn sockopt<T: Copy>(fd: RawFd, opt: libc::c_int) -> Option<T> {
    // SAFETY: `T` is plain data, valid all zeroes (the caller's types).
    let mut v: T = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: writes at most `len` bytes into `v`.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut T).cast(),
            &mut len,
        )
    };
    (r == 0 && len as usize == std::mem::size_of::<T>()).then_some(v)
}

/// The pid of the process at the other end of connected socket `fd` (`SO_PEERCRED`: the
/// kernel's record, taken when it connected or listened).
fn peer_pid(fd: RawFd) -> Result<i32, String> {
    sockopt::<libc::ucred>(fd, libc::SO_PEERCRED)
        .map(|c| c.pid)
        .ok_or_else(|| os_err("SO_PEERCRED"))
}

/// A peer process as the sender verified it: its pid, and a pidfd opened before the
/// verification (`ring::verified`), so naming that very process, where the kernel has them.
#[derive(Clone, Debug)]
pub struct Verified {
    /// The pid cross-memory attach verified.
    pub pid: i32,
    /// The descriptor it holds its segment's lock through, as verified.
    pub owner_fd: u32,
    /// That process, where the kernel has pidfds and the endpoint keeps them.
    pidfd: Option<Arc<OwnedFd>>,
}

impl Verified {
    /// Process `pid`, holding its segment's lock through `owner_fd`, verified with `pidfd`
    /// opened before the check (`ring::verified`).
    pub fn new(pid: i32, owner_fd: u32, pidfd: Option<OwnedFd>) -> Self {
        Verified {
            pid,
            owner_fd,
            pidfd: pidfd.map(Arc::new),
        }
    }

    /// Whether the process at the other end of connected socket `s`, whose `SO_PEERCRED`
    /// pid is `self.pid`, is the one verified, as far as the kernel tells: the verified
    /// process has not exited (its pid cannot have gone to another), and where pidfds carry
    /// an identity (pidfs: an inode number per process, never reused), the listener's
    /// `SO_PEERPIDFD` has the same one (a listening socket another process with this pid
    /// made before, and handed on, is not the peer's).
    fn check(&self, s: RawFd) -> Result<(), String> {
        let Some(ours) = &self.pidfd else {
            return Ok(());
        };
        let mut p = libc::pollfd {
            fd: ours.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; no wait.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        if r != 0 {
            return Err(format!(
                "the verified process {} has exited (its pid may be another's now)",
                self.pid
            ));
        }
        let Some(theirs) = peer_pidfd(s) else {
            return Ok(()); // a kernel without SO_PEERPIDFD (before 6.5): the pid check stands
        };
        match (pidfs_ino(ours.as_raw_fd()), pidfs_ino(theirs.as_raw_fd())) {
            (Some(a), Some(b)) if a != b => Err(format!(
                "the listener of pid {} is another process than the one verified",
                self.pid
            )),
            _ => Ok(()),
        }
    }
}

/// A pidfd of process `pid` (`pidfd_open`), or `None` where the kernel has none (before 5.3)
/// or the process is gone.
pub fn pidfd_open(pid: i32) -> Option<OwnedFd> {
    // SAFETY: no pointers; the result is a fresh descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: a fresh descriptor we own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// A pidfd of the process at the other end of connected socket `fd` as the kernel recorded
/// it (`SO_PEERPIDFD`, Linux 6.5), or `None`.
fn peer_pidfd(fd: RawFd) -> Option<OwnedFd> {
    let pidfd = sockopt::<libc::c_int>(fd, libc::SO_PEERPIDFD).filter(|&p| p >= 0)?;
    // SAFETY: a fresh descriptor the kernel gave us.
    Some(unsafe { OwnedFd::from_raw_fd(pidfd) })
}

/// The process identity of pidfd `fd`: its inode number where pidfds live on pidfs (Linux
/// 6.9: one inode per process, never reused), `None` where they share one anonymous inode.
fn pidfs_ino(fd: RawFd) -> Option<u64> {
    static PIDFS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let stat = |fd: RawFd| {
        // SAFETY: plain data; all zeroes is valid.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: writes into `st` only.
        (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st)
    };
    let pidfs = *PIDFS.get_or_init(|| {
        // Anonymous-inode pidfds (before pidfs) all share one inode: two processes' differ
        // only on pidfs.
        let me = pidfd_open(std::process::id() as i32);
        let init = pidfd_open(1);
        match (
            me.and_then(|f| stat(f.as_raw_fd())),
            init.and_then(|f| stat(f.as_raw_fd())),
        ) {
            (Some(a), Some(b)) => a.st_ino != b.st_ino,
            _ => false,
        }
    });
    pidfs.then(|| stat(fd).map(|st| st.st_ino))?
}

/// Room for one descriptor's control message.
#[repr(C, align(8))]
struct Cmsg([u8; 64]);

/// Sends `fd`, the descriptor of allocation `alloc_id`, to the endpoint whose segment is
/// `seg` and whose owner is the process `who`. Never waits.
pub fn send(seg: &str, who: &Verified, alloc_id: u64, fd: BorrowedFd<'_>) -> Result<(), String> {
    let pid = who.pid;
    let (a, alen) = addr_of(seg).ok_or("the segment name is too long for a socket name")?;
    let s = socket()?;
    // SAFETY: `a` is a valid address of `alen` bytes.
    let r = unsafe { libc::connect(s.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), alen) };
    if r != 0 {
        return Err(os_err("connecting to the peer's descriptor socket"));
    }
    let theirs = peer_pid(s.as_raw_fd())?;
    if theirs != pid {
        return Err(format!(
            "the peer's descriptor socket is held by pid {theirs}, not the peer's verified {pid}"
        ));
    }
    who.check(s.as_raw_fd())?;
    send_on(&s, alloc_id, fd)
}

/// Sends the one message of a connection: `alloc_id` and `fd`.
fn send_on(s: &OwnedFd, alloc_id: u64, fd: BorrowedFd<'_>) -> Result<(), String> {
    let mut body = [0u8; MSG_LEN];
    body[..4].copy_from_slice(&MAGIC.to_le_bytes());
    body[4..].copy_from_slice(&alloc_id.to_le_bytes());
    let mut iov = libc::iovec {
        iov_base: body.as_mut_ptr().cast(),
        iov_len: MSG_LEN,
    };
    let mut cm = Cmsg([0; 64]);
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    // SAFETY: plain data; all zeroes is valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cm.0.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at `cm`, which has room for one header and one descriptor
    // (`space` <= 64); the header is written in bounds.
    unsafe {
        let h = libc::CMSG_FIRSTHDR(&msg);
        (*h).cmsg_level = libc::SOL_SOCKET;
        (*h).cmsg_type = libc::SCM_RIGHTS;
        (*h).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(h).cast::<RawFd>(), fd.as_raw_fd());
    }
    // SAFETY: every pointer in `msg` is valid for the call.
    let n = unsafe { libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if n != MSG_LEN as isize {
        return Err(os_err("sending the descriptor"));
    }
    Ok(())
}

/// A descriptor a peer passed, waiting for the announcement that names it.
struct Waiting {
    pid: i32,
    alloc_id: u64,
    fd: Foreign,
}

/// Descriptors handed to the closer and not closed yet, in every endpoint.
static CLOSING: AtomicUsize = AtomicUsize::new(0);
/// Past this many waiting to be closed, an inbox accepts no more connections (they wait in the
/// backlog; once it is full their senders' connects fail and they send staged): what strangers
/// pass cannot pile up behind a close that never ends.
const CLOSING_MAX: usize = 256;

/// The closer's queue; `None` where its thread could not be started.
static CLOSER: std::sync::OnceLock<Option<std::sync::mpsc::Sender<OwnedFd>>> =
    std::sync::OnceLock::new();

/// Closes `fd`, a descriptor someone else made (a connection to our socket, what it passed),
/// on the process's closer thread: closing the last descriptor of a file may wait (a socket
/// with `SO_LINGER` whose queue cannot drain, a file whose filesystem answers its flush late
/// or never), and whoever passed it chose what it is. Never waits. Where no closer thread
/// could be started, closed here.
pub fn close_later(fd: OwnedFd) {
    let closer = CLOSER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<OwnedFd>();
        std::thread::Builder::new()
            .name("xfabric-fd-close".into())
            .spawn(move || {
                for fd in rx {
                    drop(fd);
                    CLOSING.fetch_sub(1, Ordering::Relaxed);
                }
            })
            .map_err(|e| tracing::warn!("shm: no descriptor closer thread ({e})"))
            .ok()
            .map(|_| tx)
    });
    let Some(tx) = closer else {
        drop(fd);
        return;
    };
    CLOSING.fetch_add(1, Ordering::Relaxed);
    if let Err(back) = tx.send(fd) {
        CLOSING.fetch_sub(1, Ordering::Relaxed);
        drop(back.0);
    }
}

/// A descriptor someone else made (an accepted connection, a descriptor passed over one):
/// closed by the closer thread when dropped (`close_later`).
pub struct Foreign(Option<OwnedFd>);

impl Foreign {
    fn new(fd: OwnedFd) -> Foreign {
        Foreign(Some(fd))
    }

    /// The descriptor, for a call that only uses it.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.0.as_ref().expect("taken only by drop").as_fd()
    }

    fn as_raw_fd(&self) -> RawFd {
        self.as_fd().as_raw_fd()
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        if let Some(fd) = self.0.take() {
            close_later(fd);
        }
    }
}

/// The receiving side: the listener, and the descriptors taken from it.
pub struct Inbox {
    /// Ours, but the connections queued on it, and what they carry, are anyone's: closed as
    /// theirs are (`Foreign`).
    listener: Foreign,
    waiting: Vec<Waiting>,
    /// Accepted connections of known pids with nothing to read yet, and when they came.
    unread: Vec<(Foreign, i32, std::time::Instant)>,
}

impl Inbox {
    /// Listens for the endpoint whose segment is `seg`.
    pub fn bind(seg: &str) -> Result<Inbox, String> {
        let (a, alen) = addr_of(seg).ok_or("the segment name is too long for a socket name")?;
        let s = socket()?;
        // SAFETY: `a` is a valid address of `alen` bytes.
        if unsafe { libc::bind(s.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), alen) } != 0
        {
            return Err(os_err("binding the descriptor socket"));
        }
        // SAFETY: no pointer arguments.
        if unsafe { libc::listen(s.as_raw_fd(), BACKLOG) } != 0 {
            return Err(os_err("listening on the descriptor socket"));
        }
        Ok(Inbox {
            listener: Foreign::new(s),
            waiting: Vec::new(),
            unread: Vec::new(),
        })
    }

    /// Takes in what is queued on the listener, keeping what comes from a pid `verdict` says
    /// to keep. Never waits.
    pub fn drain(&mut self, verdict: impl Fn(i32) -> Verdict) {
        // First the connections whose message had not come at an earlier look.
        let now = std::time::Instant::now();
        for (c, pid, since) in std::mem::take(&mut self.unread) {
            match verdict(pid) {
                Verdict::Keep => {}
                Verdict::Discard => {
                    DISCARDED.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Verdict::Refuse => continue,
            }
            match self.read_one(&c, pid) {
                Ok(Some(w)) => self.keep(w),
                Ok(None) if now.duration_since(since) < UNREAD_AGE => {
                    self.unread.push((c, pid, since))
                }
                Ok(None) => {
                    REFUSED.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        "shm: pid {pid} connected to pass a CUDA descriptor and sent nothing"
                    );
                }
                Err(why) => {
                    REFUSED.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("shm: a passed CUDA descriptor refused: {why}");
                }
            }
        }
        for _ in 0..ACCEPT_MAX {
            // One look closes at most a connection, what it carried and a descriptor it
            // displaces: the queue stays within a few of its bound.
            if CLOSING.load(Ordering::Relaxed) >= CLOSING_MAX {
                return;
            }
            // SAFETY: no address is asked for; a negative return is checked.
            let c = unsafe {
                libc::accept4(
                    self.listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if c < 0 {
                // EAGAIN: nothing more queued; any other error ends this look as well.
                return;
            }
            // SAFETY: a fresh descriptor we own; closed when `c` drops.
            let c = Foreign::new(unsafe { OwnedFd::from_raw_fd(c) });
            let got = peer_pid(c.as_raw_fd()).and_then(|pid| match verdict(pid) {
                Verdict::Keep => Ok(Some(pid)),
                Verdict::Discard => Ok(None),
                Verdict::Refuse => Err(format!(
                    "a connection from pid {pid}, no peer's verified pid"
                )),
            });
            let got = match got {
                // Closed unread, with whatever it carries.
                Ok(None) => {
                    DISCARDED.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Ok(Some(pid)) => Ok(pid),
                Err(why) => Err(why),
            };
            match got.and_then(|pid| self.read_one(&c, pid).map(|w| (w, pid))) {
                Ok((Some(w), _)) => self.keep(w),
                // Accepted between the peer's connect and its send: read at a later look
                // (bounded in number and in time; the oldest goes first).
                Ok((None, pid)) => {
                    let mine = self.unread.iter().filter(|u| u.1 == pid).count();
                    if mine >= UNREAD_MAX {
                        if let Some(i) = self.unread.iter().position(|u| u.1 == pid) {
                            self.unread.remove(i);
                            REFUSED.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    self.unread.push((c, pid, now));
                }
                Err(why) => {
                    REFUSED.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("shm: a passed CUDA descriptor refused: {why}");
                }
            }
        }
    }

    /// Holds a descriptor a peer passed, at most `PER_PID_MAX` per peer.
    fn keep(&mut self, w: Waiting) {
        TAKEN.fetch_add(1, Ordering::Relaxed);
        let mine = self.waiting.iter().filter(|x| x.pid == w.pid).count();
        if mine >= PER_PID_MAX {
            if let Some(i) = self.waiting.iter().position(|x| x.pid == w.pid) {
                // The oldest goes: a peer cannot make us hold more.
                self.waiting.remove(i);
            }
        }
        self.waiting.push(w);
    }

    /// Reads the one message of connection `c` from `pid` (its `SO_PEERCRED` pid, checked by
    /// the caller); `None` while nothing has come on it yet.
    fn read_one(&self, c: &Foreign, pid: i32) -> Result<Option<Waiting>, String> {
        let mut body = [0u8; MSG_LEN + 1];
        let mut iov = libc::iovec {
            iov_base: body.as_mut_ptr().cast(),
            iov_len: body.len(),
        };
        let mut cm = Cmsg([0; 64]);
        // SAFETY: plain data; all zeroes is valid.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cm.0.as_mut_ptr().cast();
        msg.msg_controllen = cm.0.len() as _;
        // SAFETY: every pointer in `msg` is valid for the call.
        let n = unsafe {
            libc::recvmsg(
                c.as_raw_fd(),
                &mut msg,
                libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(None);
            }
            return Err(format!("reading pid {pid}'s message: {e}"));
        }
        // Every descriptor that came is owned (and so closed) before anything is judged.
        let mut fds = Vec::new();
        // SAFETY: the kernel filled `msg_controllen` bytes of `cm`; the walk stays in them.
        unsafe {
            let mut h = libc::CMSG_FIRSTHDR(&msg);
            while !h.is_null() {
                if (*h).cmsg_level == libc::SOL_SOCKET && (*h).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(h);
                    let bytes = ((*h).cmsg_len as usize).saturating_sub(data as usize - h as usize);
                    for i in 0..bytes / std::mem::size_of::<RawFd>() {
                        let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                        fds.push(Foreign::new(OwnedFd::from_raw_fd(fd)));
                    }
                }
                h = libc::CMSG_NXTHDR(&msg, h);
            }
        }
        if msg.msg_flags & (libc::MSG_CTRUNC | libc::MSG_TRUNC) != 0 || n as usize != MSG_LEN {
            return Err(format!(
                "pid {pid} sent a message of {n} bytes, or too much"
            ));
        }
        if fds.len() != 1 {
            return Err(format!("pid {pid} sent {} descriptors, not one", fds.len()));
        }
        let mut w = [0u8; 4];
        w.copy_from_slice(&body[..4]);
        if u32::from_le_bytes(w) != MAGIC {
            return Err(format!("pid {pid} sent no descriptor message"));
        }
        let mut id = [0u8; 8];
        id.copy_from_slice(&body[4..MSG_LEN]);
        Ok(Some(Waiting {
            pid,
            alloc_id: u64::from_le_bytes(id),
            fd: fds.pop().expect("one, checked"),
        }))
    }

    /// The descriptor `pid` passed for allocation `alloc_id`, if it came (the latest, should
    /// it have come more than once: the others close).
    pub fn take(&mut self, pid: i32, alloc_id: u64) -> Option<Foreign> {
        let mut got = None;
        let mut i = 0;
        while i < self.waiting.len() {
            let w = &self.waiting[i];
            if w.pid == pid && w.alloc_id == alloc_id {
                // A later one replaces (and closes) an earlier one.
                got = Some(self.waiting.remove(i).fd);
            } else {
                i += 1;
            }
        }
        got
    }

    /// `pid` is gone: what it passed closes.
    pub fn drop_pid(&mut self, pid: i32) {
        self.waiting.retain(|w| w.pid != pid);
        self.unread.retain(|(_, p, _)| *p != pid);
    }

    /// The listener, as dropping the inbox would close it (the test times it alone).
    #[cfg(test)]
    fn take_listener(&mut self) -> Foreign {
        std::mem::replace(&mut self.listener, Foreign(None))
    }

    /// Descriptors waiting.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;

    fn inode(fd: BorrowedFd<'_>) -> u64 {
        let f = std::fs::File::from(fd.try_clone_to_owned().unwrap());
        f.metadata().unwrap().ino()
    }

    /// The tests count `REFUSED`, which every inbox of the process adds to: one at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn name(what: &str) -> String {
        format!("fdpass-test-{}-{what}", std::process::id())
    }

    /// Keeps what `me` passes, refuses the rest.
    fn only(me: i32) -> impl Fn(i32) -> Verdict {
        move |p| {
            if p == me {
                Verdict::Keep
            } else {
                Verdict::Refuse
            }
        }
    }

    /// Reads all that the connection `lingering_socket` made to `l` sent, so that its close
    /// ends.
    fn drain_peer(l: std::net::TcpListener) {
        use std::io::Read;
        let (mut c, _) = l.accept().unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        let mut sink = Vec::new();
        c.read_to_end(&mut sink).unwrap();
    }

    /// This process, verified as a peer would be.
    fn this() -> Verified {
        let me = std::process::id() as i32;
        Verified::new(me, 0, pidfd_open(me))
    }

    /// Waits (bounded) until the closer has closed all it was handed.
    fn settled() {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while CLOSING.load(Ordering::Relaxed) != 0 {
            assert!(std::time::Instant::now() < deadline, "the closer is stuck");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Descriptors of this process open on `file`'s inode.
    fn open_on(file: BorrowedFd<'_>) -> usize {
        let ino = inode(file);
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::metadata(e.ok()?.path()).ok())
            .filter(|m| m.ino() == ino)
            .count()
    }

    /// A pid is reusable: a descriptor goes to the process verified, not to whoever holds its
    /// pid now. The verified process exited: refused. A listener of the right pid that is
    /// another process than the one verified (here: this process's listener, the identity
    /// verified being a child's): refused where pidfds carry identities (pidfs).
    #[test]
    fn a_descriptor_goes_to_the_verified_process_not_to_its_pid() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let me = std::process::id() as i32;
        let seg = name("identity");
        let mut inbox = Inbox::bind(&seg).unwrap();
        let file = tempfile_fd();
        /// Killed and reaped however the test ends.
        struct Child(std::process::Child);
        impl Drop for Child {
            fn drop(&mut self) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
        let child = Child(
            std::process::Command::new("sleep")
                .arg("30")
                .spawn()
                .unwrap(),
        );
        let theirs = pidfd_open(child.0.id() as i32).expect("pidfd_open (Linux 5.3)");
        let other = Verified::new(me, 0, Some(theirs));
        let pidfs = pidfs_ino(other.pidfd.as_ref().unwrap().as_raw_fd()).is_some();
        let r = send(&seg, &other, 1, file.as_fd());
        if pidfs {
            let e = r.unwrap_err();
            assert!(e.contains("another process than the one verified"), "{e}");
        } else {
            eprintln!("no pidfs here (Linux before 6.9): only the exit check is made");
        }
        drop(child);
        let e = send(&seg, &other, 2, file.as_fd()).unwrap_err();
        assert!(e.contains("has exited"), "{e}");
        // The verified process itself passes.
        send(&seg, &this(), 3, file.as_fd()).unwrap();
        inbox.drain(only(me));
        assert_eq!(inbox.waiting(), 1 + usize::from(!pidfs));
        assert!(inbox.take(me, 3).is_some());
        drop(inbox);
        settled();
    }

    #[test]
    fn a_discarded_peers_connections_close_unread_with_what_they_carry() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let me = std::process::id() as i32;
        let seg = name("discard");
        let mut inbox = Inbox::bind(&seg).unwrap();
        let file = tempfile_fd();
        let (refused, discarded) = (
            REFUSED.load(Ordering::Relaxed),
            DISCARDED.load(Ordering::Relaxed),
        );
        // Two messages queued, and a connection accepted before its message came.
        send(&seg, &this(), 1, file.as_fd()).unwrap();
        send(&seg, &this(), 2, file.as_fd()).unwrap();
        let s = socket().unwrap();
        let (a, alen) = addr_of(&seg).unwrap();
        // SAFETY: a valid address of `alen` bytes.
        let r =
            unsafe { libc::connect(s.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), alen) };
        assert_eq!(r, 0);
        inbox.drain(only(me));
        assert_eq!((inbox.waiting(), inbox.unread.len()), (2, 1));
        // The endpoint copies no more from that peer: what comes later (the unread
        // connection's late message, a new one) is closed unread, quietly, and what it held
        // of the peer closes.
        send_on(&s, 3, file.as_fd()).unwrap();
        send(&seg, &this(), 4, file.as_fd()).unwrap();
        inbox.drain(|_| Verdict::Discard);
        assert_eq!((inbox.waiting(), inbox.unread.len()), (2, 0));
        assert_eq!(DISCARDED.load(Ordering::Relaxed), discarded + 2);
        inbox.drop_pid(me);
        assert_eq!(inbox.waiting(), 0);
        drop(s);
        // Our own descriptor of the file is the only one left open (the one in flight on the
        // unread connection closed with it, by the closer).
        settled();
        assert_eq!(open_on(file.as_fd()), 1);
        assert_eq!(REFUSED.load(Ordering::Relaxed), refused);
    }

    #[test]
    fn a_descriptor_passes_to_the_verified_pid_only_and_what_waits_is_bounded() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let me = std::process::id() as i32;
        let seg = name("pass");
        let mut inbox = Inbox::bind(&seg).unwrap();
        let file = tempfile_fd();
        // Passed and taken under (pid, allocation id); the same file arrives.
        send(&seg, &this(), 7, file.as_fd()).unwrap();
        inbox.drain(only(me));
        assert!(inbox.take(me, 8).is_none(), "another allocation's");
        let got = inbox.take(me, 7).expect("passed");
        assert_eq!(inode(got.as_fd()), inode(file.as_fd()));
        assert!(inbox.take(me, 7).is_none(), "taken once");
        // The listener is not the pid the sender expects: nothing is sent (the empty
        // connection it left is refused by the next look).
        let before = REFUSED.load(Ordering::Relaxed);
        let e = send(&seg, &Verified::new(me + 1, 0, None), 7, file.as_fd()).unwrap_err();
        assert!(e.contains("not the peer's verified"), "{e}");
        inbox.drain(only(me));
        assert_eq!(inbox.waiting(), 0);
        assert_eq!(REFUSED.load(Ordering::Relaxed), before + 1);
        // Nobody listens there.
        assert!(send(&name("nobody"), &this(), 7, file.as_fd()).is_err());
        // From a pid that is no peer's: refused, nothing held.
        let before = REFUSED.load(Ordering::Relaxed);
        send(&seg, &this(), 9, file.as_fd()).unwrap();
        inbox.drain(|_| Verdict::Refuse);
        assert_eq!(inbox.waiting(), 0);
        assert_eq!(REFUSED.load(Ordering::Relaxed), before + 1);
        // A message without a descriptor, and one of another form: refused.
        for body in [&[0u8; MSG_LEN][..], b"hello"] {
            let s = socket().unwrap();
            let (a, alen) = addr_of(&seg).unwrap();
            // SAFETY: a valid address; `body` is readable.
            unsafe {
                assert_eq!(
                    libc::connect(s.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), alen),
                    0
                );
                assert!(libc::send(s.as_raw_fd(), body.as_ptr().cast(), body.len(), 0) > 0);
            }
            inbox.drain(only(me));
        }
        assert_eq!(inbox.waiting(), 0);
        assert_eq!(REFUSED.load(Ordering::Relaxed), before + 3);
        // A peer cannot make us hold more than PER_PID_MAX; a lost one's all close.
        for id in 0..PER_PID_MAX as u64 + 3 {
            send(&seg, &this(), 100 + id, file.as_fd()).unwrap();
        }
        inbox.drain(only(me));
        assert_eq!(inbox.waiting(), PER_PID_MAX);
        assert!(inbox.take(me, 100).is_none(), "the oldest went first");
        inbox.drop_pid(me);
        assert_eq!(inbox.waiting(), 0);
        // Nothing queued: a look returns at once.
        inbox.drain(|_| Verdict::Keep);
    }

    #[test]
    fn a_connection_accepted_before_its_message_is_read_at_a_later_look_until_it_ages() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let me = std::process::id() as i32;
        let seg = name("early");
        let mut inbox = Inbox::bind(&seg).unwrap();
        let file = tempfile_fd();
        let connect = || {
            let s = socket().unwrap();
            let (a, alen) = addr_of(&seg).unwrap();
            // SAFETY: a valid address of `alen` bytes.
            let r = unsafe {
                libc::connect(s.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), alen)
            };
            assert_eq!(r, 0);
            s
        };
        // A look between the peer's connect and its send: nothing refused, nothing held.
        let before = REFUSED.load(Ordering::Relaxed);
        let s = connect();
        inbox.drain(only(me));
        assert_eq!((inbox.waiting(), inbox.unread.len()), (0, 1));
        // The message comes: the next look takes it.
        send_on(&s, 5, file.as_fd()).unwrap();
        inbox.drain(only(me));
        assert_eq!((inbox.waiting(), inbox.unread.len()), (1, 0));
        assert!(inbox.take(me, 5).is_some());
        assert_eq!(REFUSED.load(Ordering::Relaxed), before);
        // A connection that never sends is dropped once it is older than UNREAD_AGE, and
        // no more than UNREAD_MAX of one peer wait at once.
        let silent: Vec<OwnedFd> = (0..UNREAD_MAX + 2).map(|_| connect()).collect();
        inbox.drain(only(me));
        assert_eq!(inbox.unread.len(), UNREAD_MAX);
        for u in &mut inbox.unread {
            u.2 -= UNREAD_AGE;
        }
        inbox.drain(only(me));
        assert_eq!((inbox.waiting(), inbox.unread.len()), (0, 0));
        assert_eq!(
            REFUSED.load(Ordering::Relaxed),
            before + UNREAD_MAX as u64 + 2
        );
        drop(silent);
        // A lost peer's unread connections close with it.
        let _s = connect();
        inbox.drain(only(me));
        assert_eq!(inbox.unread.len(), 1);
        inbox.drop_pid(me);
        assert_eq!(inbox.unread.len(), 0);
    }

    /// A loopback TCP connection whose last close waits `secs` seconds: its send queue full
    /// (the listener never accepts nor reads), `SO_LINGER` set. The listener goes with it.
    fn lingering_socket(secs: i32) -> (OwnedFd, std::net::TcpListener) {
        use std::io::Write;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        s.set_nonblocking(true).unwrap();
        let buf = vec![0u8; 1 << 16];
        while (&s).write(&buf).is_ok() {}
        let lg = libc::linger {
            l_onoff: 1,
            l_linger: secs,
        };
        // SAFETY: reads one linger struct.
        let r = unsafe {
            libc::setsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&lg as *const libc::linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0);
        (s.into(), l)
    }

    /// Closing what someone passed may wait (a socket lingering, a file whose filesystem
    /// answers its flush late or never): whatever a peer or a stranger passed is closed off
    /// the caller's thread, whichever way it goes (a stranger's connection, a malformed
    /// message, a lost peer's, the descriptor `take` gives for the caller to close).
    #[test]
    fn closing_what_someone_passed_never_waits() {
        let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let me = std::process::id() as i32;
        let seg = name("linger");
        let mut inbox = Inbox::bind(&seg).unwrap();
        // Well under the sockets' 3 s linger, and far above a close off the thread: a loaded
        // machine's scheduling does not decide it.
        let quick = std::time::Duration::from_secs(2);
        let timed = |what: &str, f: &mut dyn FnMut()| {
            let t = std::time::Instant::now();
            f();
            assert!(t.elapsed() < quick, "{what} took {:?}", t.elapsed());
        };
        let mut listeners = Vec::new();
        // A stranger's connection.
        let (sock, l) = lingering_socket(3);
        listeners.push(l);
        send(&seg, &this(), 1, sock.as_fd()).unwrap();
        drop(sock);
        timed("a stranger's connection", &mut || {
            inbox.drain(|_| Verdict::Refuse)
        });
        // A peer's descriptor, held, then its peer lost.
        let (sock, l) = lingering_socket(3);
        listeners.push(l);
        send(&seg, &this(), 2, sock.as_fd()).unwrap();
        drop(sock);
        inbox.drain(only(me));
        assert_eq!(inbox.waiting(), 1);
        timed("a lost peer's", &mut || inbox.drop_pid(me));
        // Taken, and handed back to be closed.
        let (sock, l) = lingering_socket(3);
        listeners.push(l);
        send(&seg, &this(), 3, sock.as_fd()).unwrap();
        drop(sock);
        inbox.drain(only(me));
        let mut got = inbox.take(me, 3);
        timed("a taken one", &mut || drop(got.take()));
        // The closer waits on each in turn: read what they sent, so that their closes end
        // (and the closer is free for the other tests).
        listeners.into_iter().for_each(drain_peer);
        settled();
        // A closer with too much on hand (stuck on what strangers passed): nothing more is
        // accepted, which would only add to it; the connection waits in the backlog.
        CLOSING.fetch_add(CLOSING_MAX, Ordering::Relaxed);
        let file = tempfile_fd();
        send(&seg, &this(), 4, file.as_fd()).unwrap();
        inbox.drain(only(me));
        assert_eq!(inbox.waiting(), 0);
        CLOSING.fetch_sub(CLOSING_MAX, Ordering::Relaxed);
        inbox.drain(only(me));
        assert!(inbox.take(me, 4).is_some());
        // The endpoint closes with a connection never accepted, carrying such a socket:
        // closing the listener closes it, and what it carries, off this thread too.
        let (sock, l) = lingering_socket(3);
        send(&seg, &this(), 5, sock.as_fd()).unwrap();
        drop(sock);
        timed("closing the inbox", &mut || drop(inbox.take_listener()));
        drain_peer(l);
        settled();
    }

    fn tempfile_fd() -> OwnedFd {
        // SAFETY: a NUL-terminated name; a negative return is checked.
        let fd = unsafe { libc::memfd_create(c"fdpass-test".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: a fresh descriptor we own.
        unsafe { OwnedFd::from_raw_fd(fd) }
    }
}
