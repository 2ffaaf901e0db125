//! FUSE over io_uring (Linux 6.14+, with the fuse module's enable_uring on):
//! one queue per possible CPU, each served by a thread pinned to that CPU.
//!
//! The kernel puts a request on the queue of the CPU its caller runs on and
//! wakes that queue's thread, which then runs where the caller just went to
//! sleep waiting; its reply wakes the caller on the same CPU. Over /dev/fuse
//! both wake-ups usually cross CPUs, and on a virtual machine waking an idle
//! CPU costs more than the work of most requests.
//!
//! Each queue registers a few entries, each a pair of buffers the kernel fills
//! with a request (fuse_in_header and the operation's fixed arguments in the
//! header buffer, names and data in the payload buffer) and reads the reply
//! from (fuse_out_header in the header buffer, reply arguments in the
//! payload). A COMMIT_AND_FETCH submission returns a reply and offers the entry
//! for the next request in one step. FORGETs and INTERRUPTs still come through
//! /dev/fuse, which the session keeps reading.
//!
//! An fsync would hold the queue's only thread through a commit, and with it
//! every request of that CPU: it goes to the fsync pool (`deferred`), its entry
//! stays out of the ring, and the pool posts the reply to the queue's mailbox,
//! whose eventfd the queue keeps a read pending on; the queue commits it then.

use super::abi::{self, InHeader, Op, Payload};
use super::deferred::{self, Deferred, ReplyTo, RingMailbox};
use super::ring::{self, uring_cmd, Ring};
use super::server::{is_root, Uext4Fuse};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const FUSE_IO_URING_CMD_REGISTER: u32 = 1;
const FUSE_IO_URING_CMD_COMMIT_AND_FETCH: u32 = 2;

/// struct fuse_uring_req_header: in_out (128), op_in (128), ring_ent_in_out (32).
const HEADER_LEN: usize = 288;
const OP_IN_AT: usize = 128;
const ENT_COMMIT_ID_AT: usize = 256 + 8;
const ENT_PAYLOAD_SZ_AT: usize = 256 + 16;

/// Entries each queue offers the kernel: requests of one CPU that can be in
/// flight at once (a caller waits for its own; background reads add more, and
/// an fsync holds its entry until its commit is on disk). Buffers are touched
/// only as requests fill them, so idle entries cost address space, not memory.
const QUEUE_DEPTH: usize = 8;

/// The tag of the queue's pending eventfd read (entries' tags are their index).
const MAILBOX_TAG: u64 = u64::MAX;

/// How often an idle queue thread looks whether the session has ended.
const IDLE_CHECK: Duration = Duration::from_millis(200);

/// The possible CPUs (every one must have a queue before the kernel uses the ring).
pub fn possible_cpus() -> usize {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    // "0-N" or a list like "0,2-3": the highest number plus one.
    let highest = text.trim().split([',', '-']).filter_map(|n| n.parse::<usize>().ok()).max();
    // SAFETY: sysconf has no preconditions.
    highest.map(|n| n + 1).unwrap_or_else(|| unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize)
}

/// Whether the fuse module lets servers use io_uring.
pub fn kernel_allows() -> bool {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").is_ok_and(|v| v.trim() == "Y")
}

/// Turns on the fuse module's enable_uring (root only).
pub fn kernel_allow() -> io::Result<()> {
    std::fs::write("/sys/module/fuse/parameters/enable_uring", "Y")
}

/// One registered entry: the header buffer and the payload buffer the kernel
/// writes requests into, and the iovec pair that names them at registration.
struct Entry {
    header: Box<[u8]>,
    payload: Box<[u8]>,
    iov: Box<[libc::iovec; 2]>,
}

impl Entry {
    fn new(payload_len: usize) -> Entry {
        let mut header = vec![0u8; HEADER_LEN].into_boxed_slice();
        let mut payload = vec![0u8; payload_len].into_boxed_slice();
        let iov = Box::new([
            libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: header.len() },
            libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: payload.len() },
        ]);
        Entry { header, payload, iov }
    }
}

/// fuse_uring_cmd_req: flags (u64), commit_id (u64), qid (u16), padding.
fn cmd_req(commit_id: u64, qid: u16) -> [u8; 24] {
    let mut c = [0u8; 24];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

/// Scheduling policy switches around a reply (see `serve_queue`).
struct Yielding {
    allowed: bool,
}

impl Yielding {
    fn set(&mut self, policy: i32) {
        if !self.allowed {
            return;
        }
        let param = libc::sched_param { sched_priority: 0 };
        // SAFETY: sets the calling thread's policy; param outlives the call.
        if unsafe { libc::sched_setscheduler(0, policy, &param) } != 0 {
            // Returning to SCHED_OTHER needs CAP_SYS_NICE (or RLIMIT_NICE): do
            // without the trick rather than stay SCHED_IDLE.
            self.allowed = false;
            // SAFETY: as above.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) };
        }
    }
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t with one bit set, applied to this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        // A CPU that is offline now cannot be pinned to; the queue still serves.
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Serves queue `qid` on the session of `dev_fd` until the session ends or
/// `stop` is raised. Returns an error only if the queue could not be set up
/// (the kernel then falls back to /dev/fuse for the whole session).
pub fn serve_queue(
    server: &Uext4Fuse,
    dev_fd: i32,
    qid: usize,
    payload_len: usize,
    stop: &AtomicBool,
    deferred: &Arc<Deferred>,
) -> io::Result<()> {
    pin_to_cpu(qid);
    // The buffers first: the ring is dropped before them, so nothing the
    // kernel still holds can point at freed memory.
    let mut entries: Vec<Entry> = (0..QUEUE_DEPTH).map(|_| Entry::new(payload_len)).collect();
    let mailbox = Arc::new(RingMailbox::new()?);
    let mut wake_count = Box::new([0u8; 8]);
    let mut ring = Ring::new((QUEUE_DEPTH * 2 + 2) as u32)?;
    let register = |ring: &mut Ring, e: &Entry, tag: usize| {
        let sqe = uring_cmd(
            dev_fd,
            FUSE_IO_URING_CMD_REGISTER,
            e.iov.as_ptr() as u64,
            2,
            tag as u64,
            &cmd_req(0, qid as u16),
        );
        ring.push(&sqe)
    };
    for (tag, e) in entries.iter().enumerate() {
        register(&mut ring, e, tag)?;
    }
    let arm_mailbox = |ring: &mut Ring, count: &mut [u8; 8]| {
        ring.push(&ring::read(mailbox.event_fd(), count.as_mut_ptr() as u64, 8, MAILBOX_TAG))
    };
    arm_mailbox(&mut ring, &mut wake_count)?;
    let mut live = QUEUE_DEPTH;
    let mut scratch = Vec::new();
    let mut small = [0u8; 64];
    let mut yielding = Yielding { allowed: is_root() };
    // Fault injection for the tests: this queue fails after that many requests.
    let mut fail_after: Option<u64> =
        std::env::var("UEXT4_TEST_RING_FAIL_AFTER").ok().and_then(|n| n.parse().ok()).filter(|_| qid == 0);
    while live > 0 {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        ring.submit_and_wait(IDLE_CHECK)?;
        let mut waking = false;
        while let Some(c) = ring.next_completion() {
            if c.user_data == MAILBOX_TAG {
                // Replies the fsync pool made: commit them, and listen again.
                for (tag, h, error) in mailbox.take() {
                    let Some(e) = entries.get_mut(tag) else { continue };
                    abi::put_out_header(&mut e.header, abi::OUT_HEADER_LEN as u32, -error, h.unique);
                    commit(&mut ring, e, dev_fd, tag, qid)?;
                    waking = true;
                }
                if c.res < 0 && c.res != -libc::EINTR && c.res != -libc::EAGAIN {
                    return Err(io::Error::from_raw_os_error(-c.res));
                }
                arm_mailbox(&mut ring, &mut wake_count)?;
                continue;
            }
            let tag = c.user_data as usize;
            let Some(e) = entries.get_mut(tag) else { continue };
            match -c.res {
                0 => {}
                // Registered before the kernel had taken our INIT reply: again.
                libc::EAGAIN | libc::EINTR => {
                    std::thread::sleep(Duration::from_millis(1));
                    register(&mut ring, e, tag)?;
                    continue;
                }
                // The session is over (unmounted or aborted), or we are exiting.
                libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED => {
                    live -= 1;
                    continue;
                }
                errno => {
                    let err = io::Error::from_raw_os_error(errno);
                    server.log(&format!("io_uring queue {qid}: {err}"));
                    return Err(err);
                }
            }
            if let Some(n) = fail_after.as_mut() {
                if *n == 0 {
                    return Err(io::Error::other("failure injected by UEXT4_TEST_RING_FAIL_AFTER"));
                }
                *n -= 1;
            }
            let opcode = u32::from_ne_bytes(e.header[4..8].try_into().unwrap());
            if deferred::defers(opcode) {
                if let Some(h) = InHeader::parse(&e.header) {
                    server.count(true);
                    // The entry stays ours until the pool's reply comes back.
                    deferred.submit(h, ReplyTo::Ring { mailbox: mailbox.clone(), tag });
                    continue;
                }
            }
            answer(server, e, &mut scratch, &mut small);
            commit(&mut ring, e, dev_fd, tag, qid)?;
            // Closes and readahead come in the background: nobody waits on
            // this CPU for them (and a sequential reader had better run on
            // another CPU while this one reads ahead for it).
            waking |= !matches!(opcode, abi::FUSE_RELEASE | abi::FUSE_READ);
        }
        if waking {
            // A reply wakes its caller, and the scheduler places a woken task
            // on an idle CPU rather than on a busy one: this CPU, busy with us,
            // would lose the caller to another CPU (a costly wake-up there, and
            // its next request then lands on that CPU's queue). A CPU running
            // only SCHED_IDLE work counts as idle, so for the moment of the
            // reply we are SCHED_IDLE: the caller comes back here and preempts
            // us; we return to SCHED_OTHER as soon as we run again.
            yielding.set(libc::SCHED_IDLE);
            let submitted = ring.submit();
            yielding.set(libc::SCHED_OTHER);
            submitted?;
        }
    }
    Ok(())
}

/// Returns entry `tag`'s reply (already in its buffers) and offers the entry
/// for the next request.
fn commit(ring: &mut Ring, e: &mut Entry, dev_fd: i32, tag: usize, qid: usize) -> io::Result<()> {
    let reply_len = u32::from_ne_bytes(e.header[0..4].try_into().unwrap()) as usize - abi::OUT_HEADER_LEN;
    e.header[ENT_PAYLOAD_SZ_AT..ENT_PAYLOAD_SZ_AT + 4].copy_from_slice(&(reply_len as u32).to_ne_bytes());
    let commit_id = u64::from_ne_bytes(e.header[ENT_COMMIT_ID_AT..ENT_COMMIT_ID_AT + 8].try_into().unwrap());
    let sqe = uring_cmd(dev_fd, FUSE_IO_URING_CMD_COMMIT_AND_FETCH, 0, 0, tag as u64, &cmd_req(commit_id, qid as u16));
    ring.push(&sqe)
}

/// Handles the request in `e` and leaves its reply there (header and payload).
fn answer(server: &Uext4Fuse, e: &mut Entry, scratch: &mut Vec<u8>, small: &mut [u8; 64]) {
    let Some(h) = InHeader::parse(&e.header) else {
        // No request to answer: an empty reply with no unique the kernel knows.
        abi::put_out_header(&mut e.header, abi::OUT_HEADER_LEN as u32, -libc::EIO, 0);
        return;
    };
    server.count(true);
    let payload_sz = u32::from_ne_bytes(e.header[ENT_PAYLOAD_SZ_AT..ENT_PAYLOAD_SZ_AT + 4].try_into().unwrap());
    let payload_sz = (payload_sz as usize).min(e.payload.len());
    let fixed_len = abi::fixed_args_len(h.opcode).min(128);
    let fixed = &e.header[OP_IN_AT..OP_IN_AT + fixed_len];
    let (error, len) = if h.opcode == abi::FUSE_WRITE {
        // The data stays where the kernel put it; the short reply goes aside.
        let mut out = Payload::new(&mut small[..]);
        let error = match Op::parse(h.opcode, fixed, &e.payload[..payload_sz]) {
            Ok(op) => server.serve(&h, op, &mut out, None).unwrap_or(0),
            Err(_) => libc::EINVAL,
        };
        let len = out.len();
        e.payload[..len].copy_from_slice(&small[..len]);
        (error, len)
    } else {
        // Names and values are small: copied aside, the reply is built in place.
        scratch.clear();
        scratch.extend_from_slice(&e.payload[..payload_sz]);
        let mut out = Payload::new(&mut e.payload);
        let error = match Op::parse(h.opcode, fixed, scratch) {
            Ok(op) => server.serve(&h, op, &mut out, None).unwrap_or(0),
            Err(_) => libc::EINVAL,
        };
        (error, out.len())
    };
    let len = if error == 0 { len } else { 0 };
    abi::put_out_header(&mut e.header, (abi::OUT_HEADER_LEN + len) as u32, -error, h.unique);
}

/// Starts one pinned thread per possible CPU.
/// If a queue thread fails once the ring is in use, `abort` ends the session:
/// the kernel never moves a request to another CPU's queue, so the requests of
/// that CPU would otherwise wait forever.
pub fn start(
    server: Arc<Uext4Fuse>,
    dev_fd: i32,
    payload_len: usize,
    stop: Arc<AtomicBool>,
    abort: Arc<dyn Fn() + Send + Sync>,
    deferred: Arc<Deferred>,
) -> io::Result<Vec<std::thread::JoinHandle<()>>> {
    (0..possible_cpus())
        .map(|qid| {
            let (server, stop, abort, deferred) = (server.clone(), stop.clone(), abort.clone(), deferred.clone());
            std::thread::Builder::new().name(format!("uext4-ring{qid}")).spawn(move || {
                // Requests are contained one by one (`Uext4Fuse::serve`); this
                // catches a panic in the queue's own code, which would otherwise
                // leave the thread dead and its CPU's callers waiting forever.
                let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    serve_queue(&server, dev_fd, qid, payload_len, &stop, &deferred)
                }))
                .unwrap_or_else(|_| Err(io::Error::other("the queue's thread panicked")));
                if let Err(e) = served {
                    server.log(&format!("io_uring queue {qid} stopped: {e}; ending the session"));
                    if !stop.load(Ordering::Relaxed) {
                        abort();
                    }
                }
            })
        })
        .collect()
}
