//! A raw verbs peer for tests: a process that speaks the side channel and drives an RC queue
//! pair of its own as a broken or hostile peer could, every byte and every work request its
//! choice. It answers the call-backs that prove its name (so that what stops it is the
//! endpoint's checks, not a missing proof), connects a queue pair to an endpoint's, reads the
//! engine's frames out of the chunks it is sent, and posts what it is told: chunks of any
//! bytes, RDMA reads and writes at any address and key, writes with immediate data. Tests use
//! it to check that nothing a peer's NIC does reaches memory it was not given, or makes an
//! endpoint hold without bound. Not for applications.
//!
//! The layout it speaks is `net`'s: chunks of at most `CHUNK` bytes starting with a header
//! (data credits returned, u16; reserve credits returned, u16; kind, u8; 3 bytes zero), `RQ`
//! receives per connection of which `RESERVE` only for credit-only chunks, and `READY` as the
//! connector's last word on the side channel. Those constants are private to `net`; the
//! values here are theirs (a test against an endpoint fails at the handshake or the first
//! chunk if they drift).

use std::ffi::c_int;
use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use xfabric_core::rdm::wire::{self, Frame, PREFIX};
use xfabric_core::{Error, Result};

use super::ib::{self, Cq, Mr, Nic, Qp, QpInfo};
use super::net::claim::{self, Hello, HELLO, NO, VERIFY_MAGIC, VERSION, YES};
use super::net::pull;
pub use super::net::CHUNK;
use super::sys;
use crate::inet;

/// `net`'s chunk header bytes.
pub const HDR: usize = 8;
/// `net`'s receives posted per connection.
pub const RQ: u32 = 64;
/// `net`'s receives of those only credit-only chunks may use.
pub const RESERVE: u32 = 4;
/// `net`'s chunk kind of a chunk carrying frames' bytes.
pub const KIND_DATA: u8 = 0;
/// `net`'s chunk kind of a chunk carrying only credits.
pub const KIND_CREDIT: u8 = 1;
/// `net`'s connector's last word once its queue pair is ready to receive.
pub const READY: u8 = 0x52;

/// Work completion statuses (`enum ibv_wc_status`) the tests look for.
pub const WC_SUCCESS: u32 = sys::IBV_WC_SUCCESS;
/// A remote access error: the peer's NIC refused the key, the range or the access.
pub const WC_REM_ACCESS_ERR: u32 = sys::IBV_WC_REM_ACCESS_ERR;
/// Flushed: the queue pair was in the error state.
pub const WC_WR_FLUSH_ERR: u32 = sys::IBV_WC_WR_FLUSH_ERR;
/// Transport retries exceeded: the peer's queue pair does not answer.
pub const WC_RETRY_EXC_ERR: u32 = sys::IBV_WC_RETRY_EXC_ERR;

/// Send-side work requests one link keeps outstanding at most (below `ib::SQ_DEPTH`).
const TX: usize = 64;
/// Bytes of a link's buffer for RDMA reads and writes.
pub const SCRATCH: usize = 1 << 20;
/// A receive's work request id is its slot; a send's has this bit.
const SEND_BIT: u64 = 1 << 32;

fn timed_out(what: &str) -> Error {
    Error::from_io(
        format!("raw verbs peer: {what}"),
        std::io::Error::from_raw_os_error(libc::ETIMEDOUT),
    )
}

fn io(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::from_io(format!("raw verbs peer: {what}"), e)
}

/// What the raw peer's listener heard from a connection to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// A call-back's question (did a connection of ours from `src` say a hello with
    /// `nonce`?) and whether we said yes.
    Question {
        src: SocketAddr,
        nonce: u64,
        yes: bool,
    },
    /// An endpoint's hello (it dialed us): not served, the connection closed.
    Hello(Hello),
    /// Anything else, of so many bytes.
    Other(usize),
}

/// A peer with a name (a listening TCP address on the NIC's IPv4 address, whose call-backs a
/// thread answers for the hellos it said) and the device's queue pairs.
pub struct RawPeer {
    nic: Arc<Nic>,
    name: SocketAddr,
    /// The hellos we said: the connection's source address and the nonce.
    ours: Arc<Mutex<Vec<(SocketAddr, u64)>>>,
    heard: Arc<Mutex<Vec<Heard>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RawPeer {
    /// Opens the first device (`ib::nic`) and listens on its address; the error says why
    /// there is none.
    pub fn new() -> Result<RawPeer> {
        let nic = ib::nic()
            .and_then(|dev| ib::Nic::open(&dev))
            .map_err(|why| Error::NoData(format!("raw verbs peer: {why}")))?;
        let listener = TcpListener::bind(SocketAddr::new(IpAddr::V4(nic.ip), 0))
            .map_err(io("listen on the device's address"))?;
        listener
            .set_nonblocking(true)
            .map_err(io("listener non-blocking"))?;
        let name = listener.local_addr().map_err(io("listener address"))?;
        let ours = Arc::new(Mutex::new(Vec::new()));
        let heard = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (o, h, s) = (ours.clone(), heard.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("raw-verbs-peer".into())
            .spawn(move || answer_call_backs(&listener, &o, &h, &s))
            .map_err(io("listener thread"))?;
        Ok(RawPeer {
            nic,
            name,
            ours,
            heard,
            stop,
            thread: Some(thread),
        })
    }

    /// Our name: the address our hellos claim and our listener answers at.
    pub fn name(&self) -> SocketAddr {
        self.name
    }

    /// Our name as an endpoint's address (what an AV takes).
    pub fn raw_name(&self) -> Vec<u8> {
        inet::encode(&self.name)
    }

    /// The device's RoCE v2 GID (our name's address, mapped).
    pub fn gid(&self) -> [u8; 16] {
        self.nic.gid
    }

    /// What our listener heard so far.
    pub fn heard(&self) -> Vec<Heard> {
        self.heard.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Says a hello to the endpoint named `to` (ours, with a queue pair of ours, as `connect`
    /// says it), changed by `edit` first, and vouches for it when called back. Returns the
    /// hello said and every byte the endpoint sent until it closed the connection: nothing
    /// when it refused the hello, its answering hello when it took it (it then closes when
    /// no READY comes). An error when it neither answered nor closed within `within`.
    pub fn hello_answer(
        &self,
        to: SocketAddr,
        edit: impl FnOnce(&mut Hello),
        within: Duration,
    ) -> Result<(Hello, Vec<u8>)> {
        let mut stream = dial(self.nic.ip, to)?;
        let link = RawLink::new(&self.nic, stream.try_clone().map_err(io("clone"))?)?;
        let mut hello = self.hello_for(&link)?;
        edit(&mut hello);
        self.vouch(&stream, hello.nonce)?;
        stream
            .write_all(&hello.encode())
            .map_err(io("write the hello"))?;
        stream
            .set_read_timeout(Some(within))
            .map_err(io("read timeout"))?;
        let mut got = Vec::new();
        match stream.read_to_end(&mut got) {
            Ok(_) => Ok((hello, got)),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Err(
                timed_out("the endpoint neither answered the hello nor closed"),
            ),
            // A reset is a close too.
            Err(e) if e.kind() == ErrorKind::ConnectionReset => Ok((hello, got)),
            Err(e) => Err(io("read the answer")(e)),
        }
    }

    /// Connects a queue pair of ours to one of the endpoint named `to`, as its peer of our
    /// name: our hello (proven by our listener's answer to its call-back), its answer, READY.
    /// The link has `RQ` receives posted.
    pub fn connect(&self, to: SocketAddr, within: Duration) -> Result<RawLink> {
        let mut stream = dial(self.nic.ip, to)?;
        let mut link = RawLink::new(&self.nic, stream.try_clone().map_err(io("clone"))?)?;
        let hello = self.hello_for(&link)?;
        self.vouch(&stream, hello.nonce)?;
        stream
            .write_all(&hello.encode())
            .map_err(io("write the hello"))?;
        stream
            .set_read_timeout(Some(within))
            .map_err(io("read timeout"))?;
        let mut answer = [0u8; HELLO];
        stream.read_exact(&mut answer).map_err(|e| {
            if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) {
                timed_out("no answer to the hello")
            } else {
                io("read the answer")(e)
            }
        })?;
        let their = Hello::parse(&answer)
            .map_err(|why| Error::Inval(format!("raw verbs peer: the answer: {why}")))?;
        link.qp.connect(link.psn, &their.qp)?;
        stream.write_all(&[READY]).map_err(io("write READY"))?;
        link.their = Some(their);
        Ok(link)
    }

    /// Our hello for `link`'s queue pair: our name, the device's GID, a fresh
    /// nonce, no flags.
    fn hello_for(&self, link: &RawLink) -> Result<Hello> {
        let nonce =
            claim::nonce().ok_or_else(|| Error::Inval("raw verbs peer: no nonce".into()))?;
        Ok(Hello {
            qp: QpInfo {
                qpn: link.qp.num(),
                psn: link.psn,
                gid: self.nic.gid,
            },
            name: self.name,
            flags: 0,
            nonce,
        })
    }

    /// Our listener says yes to a call-back asking about a hello with `nonce` from
    /// `stream`'s source.
    fn vouch(&self, stream: &TcpStream, nonce: u64) -> Result<()> {
        let src = stream.local_addr().map_err(io("local address"))?;
        self.ours
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((src, nonce));
        Ok(())
    }
}

impl Drop for RawPeer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The listener's thread: each connection's first `HELLO` bytes are read (bounded) and a
/// call-back's question answered, YES for a hello of ours, NO otherwise; then it is closed.
fn answer_call_backs(
    listener: &TcpListener,
    ours: &Mutex<Vec<(SocketAddr, u64)>>,
    heard: &Mutex<Vec<Heard>>,
    stop: &AtomicBool,
) {
    while !stop.load(Ordering::Acquire) {
        // Woken by a connection; `stop` is looked at every 100 ms (the owner's drop waits
        // for that at most).
        let _ = ready(
            listener.as_raw_fd(),
            libc::POLLIN,
            Instant::now() + Duration::from_millis(100),
        );
        let mut s = match listener.accept() {
            Ok((s, _)) => s,
            Err(_) => continue,
        };
        let _ = s.set_nonblocking(false);
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let mut q = [0u8; HELLO];
        let mut n = 0;
        while n < HELLO {
            match s.read(&mut q[n..]) {
                Ok(0) | Err(_) => break,
                Ok(k) => n += k,
            }
        }
        let what = if n < HELLO {
            Heard::Other(n)
        } else if let Some((src, nonce)) = parse_question(&q) {
            let yes = ours
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .contains(&(src, nonce));
            let _ = s.write_all(&[if yes { YES } else { NO }]);
            Heard::Question { src, nonce, yes }
        } else if let Ok(h) = Hello::parse(&q) {
            Heard::Hello(h)
        } else {
            Heard::Other(n)
        };
        heard.lock().unwrap_or_else(|e| e.into_inner()).push(what);
    }
}

/// Whether `fd` has `events` before `until` (poll(2)).
fn ready(fd: std::os::fd::RawFd, events: libc::c_short, until: Instant) -> bool {
    let left = until.saturating_duration_since(Instant::now());
    let ms = c_int::try_from(left.as_millis()).unwrap_or(c_int::MAX);
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one pollfd, ours for the call.
    unsafe { libc::poll(&mut p, 1, ms) == 1 }
}

/// A call-back's question (`claim::verify_msg`): magic, version, nonce at 8, the source
/// address at 16.
fn parse_question(v: &[u8; HELLO]) -> Option<(SocketAddr, u64)> {
    let magic = u32::from_le_bytes(v[0..4].try_into().ok()?);
    if magic != VERIFY_MAGIC || u16::from_le_bytes([v[4], v[5]]) != VERSION {
        return None;
    }
    let nonce = u64::from_le_bytes(v[8..16].try_into().ok()?);
    let src = inet::decode(&v[16..32]).ok()?;
    Some((src, nonce))
}

/// A connected side channel from `from` (our name's address, which the acceptor holds a
/// claim to) to `to`, blocking.
fn dial(from: Ipv4Addr, to: SocketAddr) -> Result<TcpStream> {
    let s = inet::connect_from(IpAddr::V4(from), to).map_err(io("connect"))?;
    // A non-blocking connect is done when the socket becomes writable.
    let _ = ready(
        s.as_raw_fd(),
        libc::POLLOUT,
        Instant::now() + Duration::from_secs(10),
    );
    if let Some(e) = s.take_error().map_err(io("connect"))? {
        return Err(io("connect")(e));
    }
    s.peer_addr().map_err(io("connect"))?;
    s.set_nonblocking(false).map_err(io("blocking"))?;
    let _ = s.set_nodelay(true);
    Ok(s)
}

/// One segment of an offer's descriptor (`pull::parse_desc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seg {
    pub addr: u64,
    pub len: u64,
    pub rkey: u32,
}

/// A large message the endpoint announced (`Frame::Rts`) with the memory it offered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    pub id: u32,
    pub tag: u64,
    pub len: u64,
    /// `wire::flags` bits.
    pub flags: u8,
    /// Empty when the Rts offered nothing to read.
    pub segs: Vec<Seg>,
}

/// A chunk the endpoint sent us: its header's fields and its length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkIn {
    pub data_credits: u16,
    pub reserve_credits: u16,
    pub kind: u8,
    pub len: usize,
}

/// One RC connection of a raw peer: its queue pair (own CQ), a registered buffer (`RQ`
/// receive slots, `TX` send slots, `SCRATCH` bytes for reads and writes) and the side
/// channel, open until the link is dropped.
pub struct RawLink {
    // Drop order: the QP, the registration, the CQ, then the memory.
    qp: Qp,
    mr: Mr,
    cq: Cq,
    buf: Vec<u8>,
    stream: TcpStream,
    psn: u32,
    their: Option<Hello>,
    next: u64,
    wc: Vec<sys::ibv_wc>,
    /// The bytes of the data chunks received, headers taken off, not yet parsed as frames.
    inbox: Vec<u8>,
    chunks: Vec<ChunkIn>,
    /// Send-side completions not yet waited for: work request id, status.
    done: Vec<(u64, u32)>,
    /// Receive completions that were errors (flushes), their statuses.
    rx_errors: Vec<u32>,
    /// Writes with immediate data the endpoint made into our memory: the immediates.
    imms: Vec<u32>,
}

impl RawLink {
    fn new(nic: &Arc<Nic>, stream: TcpStream) -> Result<RawLink> {
        let psn = claim::nonce().ok_or_else(|| Error::Inval("raw verbs peer: no PSN".into()))?
            as u32
            & 0xff_ffff;
        let cq = Cq::new(nic, 4 * (RQ as i32 + TX as i32))?;
        let qp = Qp::new(nic, &cq, RQ)?;
        let mut buf = vec![0u8; (RQ as usize + TX) * CHUNK + SCRATCH];
        // SAFETY: the Vec's heap block moves into the link with the registration, and the
        // link's field order drops the QP, then the registration, then the memory.
        let mr = unsafe {
            Mr::new(
                nic,
                buf.as_mut_ptr(),
                buf.len(),
                sys::IBV_ACCESS_LOCAL_WRITE,
            )?
        };
        let mut l = RawLink {
            qp,
            mr,
            cq,
            buf,
            stream,
            psn,
            their: None,
            next: 0,
            wc: vec![sys::ibv_wc::default(); 64],
            inbox: Vec::new(),
            chunks: Vec::new(),
            done: Vec::new(),
            rx_errors: Vec::new(),
            imms: Vec::new(),
        };
        for slot in 0..RQ as usize {
            l.post_recv(slot)?;
        }
        Ok(l)
    }

    /// The endpoint's answering hello (its queue pair, its name).
    pub fn their_hello(&self) -> Option<Hello> {
        self.their
    }

    /// The chunks received so far.
    pub fn chunks(&self) -> &[ChunkIn] {
        &self.chunks
    }

    /// The statuses of receive completions that were errors so far.
    pub fn rx_errors(&self) -> &[u32] {
        &self.rx_errors
    }

    /// The immediates of the endpoint's writes into our memory so far.
    pub fn imms(&self) -> &[u32] {
        &self.imms
    }

    fn post_recv(&mut self, slot: usize) -> Result<()> {
        let mut sge = sys::ibv_sge {
            addr: self.buf[slot * CHUNK..].as_mut_ptr() as u64,
            length: CHUNK as u32,
            lkey: self.mr.lkey(),
        };
        // SAFETY: the slot lies in the link's registered buffer, which outlives its QP
        // (field order), and is not reposted before its completion is polled.
        unsafe { self.qp.post_recv(slot as u64, &mut sge) }
    }

    /// Sleeps until the CQ has a completion or `until` passes: the CQ is armed, and one that
    /// came before the arming is taken first (it rings nothing).
    fn block(&mut self, until: Instant) {
        self.cq.arm();
        if self.poll() == 0 {
            let _ = ready(self.cq.fd(), libc::POLLIN, until);
        }
    }

    /// Takes the completions there are: receives keep their chunks (and are posted again),
    /// sends and one-sided operations their statuses. Returns how many.
    pub fn poll(&mut self) -> usize {
        let n = self.cq.poll(&mut self.wc);
        for i in 0..n {
            let wc = self.wc[i];
            if wc.wr_id & SEND_BIT != 0 {
                self.done.push((wc.wr_id, wc.status));
                continue;
            }
            if wc.status != sys::IBV_WC_SUCCESS {
                self.rx_errors.push(wc.status);
                continue;
            }
            let slot = wc.wr_id as usize;
            if wc.opcode == sys::IBV_WC_RECV_RDMA_WITH_IMM {
                self.imms.push(u32::from_be(wc.imm_data));
            } else {
                let len = (wc.byte_len as usize).min(CHUNK);
                let b = &self.buf[slot * CHUNK..slot * CHUNK + len];
                if len >= HDR {
                    let c = ChunkIn {
                        data_credits: u16::from_le_bytes([b[0], b[1]]),
                        reserve_credits: u16::from_le_bytes([b[2], b[3]]),
                        kind: b[4],
                        len,
                    };
                    if c.kind == KIND_DATA {
                        self.inbox.extend_from_slice(&b[HDR..]);
                    }
                    self.chunks.push(c);
                } else {
                    self.chunks.push(ChunkIn {
                        data_credits: 0,
                        reserve_credits: 0,
                        kind: u8::MAX,
                        len,
                    });
                }
            }
            // A failed repost shows as a missing receive: the endpoint's sends then fail.
            let _ = self.post_recv(slot);
        }
        n
    }

    /// The next whole frame the endpoint sent (its chunks' bytes parsed as the engine's
    /// frames), with its body; an error when none came within `within` or the bytes are not
    /// a frame.
    pub fn next_frame(&mut self, within: Duration) -> Result<(Frame, Vec<u8>)> {
        let deadline = Instant::now() + within;
        loop {
            if self.inbox.len() >= PREFIX {
                let p = wire::prefix(&self.inbox)
                    .map_err(|e| Error::Inval(format!("raw verbs peer: not a frame: {e}")))?;
                let whole = PREFIX as u64 + u64::from(p.ctrl_len) + p.body_len;
                if self.inbox.len() as u64 >= whole {
                    let rest = self.inbox.split_off(whole as usize);
                    let bytes = std::mem::replace(&mut self.inbox, rest);
                    let (f, body) = wire::decode_all(&bytes)
                        .map_err(|e| Error::Inval(format!("raw verbs peer: not a frame: {e}")))?;
                    return Ok((f, body.to_vec()));
                }
            }
            if self.poll() == 0 {
                if Instant::now() >= deadline {
                    return Err(timed_out("no frame"));
                }
                self.block(deadline);
            }
        }
    }

    /// The next large message the endpoint announced (frames before it skipped), with the
    /// segments its descriptor offers.
    pub fn offer(&mut self, within: Duration) -> Result<Offer> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if let (
                Frame::Rts {
                    id,
                    tag,
                    len,
                    flags,
                    desc,
                    ..
                },
                _,
            ) = self.next_frame(left)?
            {
                let segs = if desc.as_bytes().is_empty() {
                    Vec::new()
                } else {
                    pull::parse_desc(&desc)
                        .ok_or_else(|| {
                            Error::Inval("raw verbs peer: an Rts's descriptor is garbage".into())
                        })?
                        .into_iter()
                        .map(|(addr, len, rkey)| Seg { addr, len, rkey })
                        .collect()
                };
                return Ok(Offer {
                    id,
                    tag,
                    len,
                    flags,
                    segs,
                });
            }
        }
    }

    /// Posts `wr` (its id set here, signaled) and returns its id.
    fn post(&mut self, wr: &mut sys::ibv_send_wr) -> Result<u64> {
        let id = SEND_BIT | self.next;
        self.next += 1;
        wr.wr_id = id;
        wr.send_flags |= sys::IBV_SEND_SIGNALED;
        // SAFETY: what the scatter list names lies in the link's registered buffer, which
        // outlives the QP; callers wait for the completion before reusing the bytes (or
        // leave them to the link). The remote range is the endpoint's NIC's to check: that
        // is what these tests are about.
        unsafe { self.qp.post_send(wr) }?;
        Ok(id)
    }

    /// Waits for the completion of send-side work request `id`: its status.
    fn wait(&mut self, id: u64, deadline: Instant) -> Result<u32> {
        loop {
            if let Some(i) = self.done.iter().position(|&(w, _)| w == id) {
                return Ok(self.done.swap_remove(i).1);
            }
            if self.poll() == 0 {
                if Instant::now() >= deadline {
                    return Err(timed_out("a work request did not complete"));
                }
                self.block(deadline);
            }
        }
    }

    /// An RDMA read of `len` bytes (at most `SCRATCH`) at `addr` with `rkey`: the
    /// completion's status and, when it succeeded, the bytes.
    pub fn read(
        &mut self,
        addr: u64,
        rkey: u32,
        len: usize,
        within: Duration,
    ) -> Result<(u32, Vec<u8>)> {
        let len = len.min(SCRATCH);
        let at = self.scratch();
        let mut sge = sys::ibv_sge {
            addr: self.buf[at..].as_mut_ptr() as u64,
            length: len as u32,
            lkey: self.mr.lkey(),
        };
        let mut wr = sys::ibv_send_wr {
            sg_list: &mut sge,
            num_sge: 1,
            opcode: sys::IBV_WR_RDMA_READ,
            ..Default::default()
        };
        wr.set_rdma(addr, rkey);
        let id = self.post(&mut wr)?;
        let st = self.wait(id, Instant::now() + within)?;
        let got = if st == WC_SUCCESS {
            self.buf[at..at + len].to_vec()
        } else {
            Vec::new()
        };
        Ok((st, got))
    }

    /// An RDMA write of `data` (at most `SCRATCH` bytes) to `addr` with `rkey`: the
    /// completion's status.
    pub fn write(&mut self, addr: u64, rkey: u32, data: &[u8], within: Duration) -> Result<u32> {
        let len = data.len().min(SCRATCH);
        let at = self.scratch();
        self.buf[at..at + len].copy_from_slice(&data[..len]);
        let mut sge = sys::ibv_sge {
            addr: self.buf[at..].as_mut_ptr() as u64,
            length: len as u32,
            lkey: self.mr.lkey(),
        };
        let mut wr = sys::ibv_send_wr {
            sg_list: &mut sge,
            num_sge: 1,
            opcode: sys::IBV_WR_RDMA_WRITE,
            ..Default::default()
        };
        wr.set_rdma(addr, rkey);
        let id = self.post(&mut wr)?;
        self.wait(id, Instant::now() + within)
    }

    /// `n` zero-length RDMA writes with immediate data `imm` (each takes one of the
    /// endpoint's posted receives), posted `TX` at most at a time: their statuses in order.
    pub fn write_imm(&mut self, n: usize, imm: u32, within: Duration) -> Result<Vec<u32>> {
        let deadline = Instant::now() + within;
        let mut ids = Vec::with_capacity(n);
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            if i >= TX {
                out.push(self.wait(ids[i - TX], deadline)?);
            }
            let mut wr = sys::ibv_send_wr {
                opcode: sys::IBV_WR_RDMA_WRITE_WITH_IMM,
                imm_data: imm.to_be(),
                ..Default::default()
            };
            // No bytes: no address or key is looked at (IB C9-88).
            wr.set_rdma(0, 0);
            ids.push(self.post(&mut wr)?);
        }
        for &id in &ids[n.saturating_sub(TX)..] {
            out.push(self.wait(id, deadline)?);
        }
        Ok(out)
    }

    /// Sends each of `chunks` (any bytes, at most `CHUNK` each: `chunk` builds `net`'s) as
    /// one message, `TX` at most outstanding at a time: their statuses in order.
    pub fn send_chunks(&mut self, chunks: &[Vec<u8>], within: Duration) -> Result<Vec<u32>> {
        let deadline = Instant::now() + within;
        let mut ids = Vec::with_capacity(chunks.len());
        let mut out = Vec::with_capacity(chunks.len());
        for (i, c) in chunks.iter().enumerate() {
            if i >= TX {
                out.push(self.wait(ids[i - TX], deadline)?);
            }
            let len = c.len().min(CHUNK);
            let at = (RQ as usize + i % TX) * CHUNK;
            self.buf[at..at + len].copy_from_slice(&c[..len]);
            let mut sge = sys::ibv_sge {
                addr: self.buf[at..].as_mut_ptr() as u64,
                length: len as u32,
                lkey: self.mr.lkey(),
            };
            let mut wr = sys::ibv_send_wr {
                sg_list: &mut sge,
                num_sge: 1,
                opcode: sys::IBV_WR_SEND,
                ..Default::default()
            };
            ids.push(self.post(&mut wr)?);
        }
        for &id in &ids[chunks.len().saturating_sub(TX)..] {
            out.push(self.wait(id, deadline)?);
        }
        Ok(out)
    }

    /// A chunk as `net` frames one: the header (credits returned, kind) and `payload`.
    pub fn chunk(kind: u8, data_credits: u16, reserve_credits: u16, payload: &[u8]) -> Vec<u8> {
        let mut c = vec![0u8; HDR];
        c[0..2].copy_from_slice(&data_credits.to_le_bytes());
        c[2..4].copy_from_slice(&reserve_credits.to_le_bytes());
        c[4] = kind;
        c.extend_from_slice(payload);
        c
    }

    /// Whether the endpoint closed the side channel within `within` (bytes it sends
    /// meanwhile are dropped; the completions there are are taken).
    pub fn closed_within(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut b = [0u8; 256];
        loop {
            self.poll();
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let _ = self
                .stream
                .set_read_timeout(Some(left.min(Duration::from_millis(100))));
            match self.stream.read(&mut b) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => return true,
            }
        }
    }

    /// The scratch area's offset in the buffer.
    fn scratch(&self) -> usize {
        (RQ as usize + TX) * CHUNK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the listener takes for a call-back's question is what an acceptor asks
    /// (`claim::verify_msg`), and a hello is not one.
    #[test]
    fn questions_parse_as_claim_asks_them() {
        let src: SocketAddr = "192.0.2.1:40000".parse().unwrap();
        assert_eq!(
            parse_question(&claim::verify_msg(&src, 0x0102_0304_0506_0708)),
            Some((src, 0x0102_0304_0506_0708))
        );
        let hello = Hello {
            qp: QpInfo {
                qpn: 1,
                psn: 2,
                gid: claim::gid_of(&src),
            },
            name: src,
            flags: 0,
            nonce: 3,
        };
        assert_eq!(parse_question(&hello.encode()), None);
    }

    #[test]
    fn chunks_carry_net_header() {
        let c = RawLink::chunk(KIND_CREDIT, 0x0102, 0x0304, b"xy");
        assert_eq!(
            c,
            [0x02, 0x01, 0x04, 0x03, KIND_CREDIT, 0, 0, 0, b'x', b'y']
        );
        assert_eq!(c.len(), HDR + 2);
    }
}
