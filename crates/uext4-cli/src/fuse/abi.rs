//! The FUSE wire format, as the kernel's `include/uapi/linux/fuse.h` defines it:
//! request headers and per-operation arguments parsed at explicit offsets, and
//! replies written the same way. Pure: no I/O, no filesystem knowledge.
//!
//! A request is a 40-byte `fuse_in_header`, then a fixed-size argument struct of
//! its operation (`fuse_read_in`, `fuse_mkdir_in`, ...), then variable data
//! (NUL-terminated names, write data, xattr values). The reader of /dev/fuse
//! receives all three in one buffer; the io_uring ring delivers the fixed struct
//! and the variable data in separate areas, so parsing takes them separately.
//! Numbers are in the host's byte order, as the kernel writes them.

/// The protocol this server speaks: 7.42 is the first with io_uring. The kernel
/// speaks the smaller of its minor and ours; every structure read or written
/// here has the same layout from 7.36 on.
pub const FUSE_KERNEL_VERSION: u32 = 7;
pub const FUSE_KERNEL_MINOR_VERSION: u32 = 42;
/// The oldest kernel protocol served: 7.36 added flags2 and the 64-byte init_in.
pub const FUSE_MIN_MINOR_VERSION: u32 = 36;

pub const FUSE_ROOT_ID: u64 = 1;
pub const IN_HEADER_LEN: usize = 40;
pub const OUT_HEADER_LEN: usize = 16;

// Opcodes (enum fuse_opcode).
pub const FUSE_LOOKUP: u32 = 1;
pub const FUSE_FORGET: u32 = 2;
pub const FUSE_GETATTR: u32 = 3;
pub const FUSE_SETATTR: u32 = 4;
pub const FUSE_READLINK: u32 = 5;
pub const FUSE_SYMLINK: u32 = 6;
pub const FUSE_MKNOD: u32 = 8;
pub const FUSE_MKDIR: u32 = 9;
pub const FUSE_UNLINK: u32 = 10;
pub const FUSE_RMDIR: u32 = 11;
pub const FUSE_RENAME: u32 = 12;
pub const FUSE_LINK: u32 = 13;
pub const FUSE_OPEN: u32 = 14;
pub const FUSE_READ: u32 = 15;
pub const FUSE_WRITE: u32 = 16;
pub const FUSE_STATFS: u32 = 17;
pub const FUSE_RELEASE: u32 = 18;
pub const FUSE_FSYNC: u32 = 20;
pub const FUSE_SETXATTR: u32 = 21;
pub const FUSE_GETXATTR: u32 = 22;
pub const FUSE_LISTXATTR: u32 = 23;
pub const FUSE_REMOVEXATTR: u32 = 24;
pub const FUSE_FLUSH: u32 = 25;
pub const FUSE_INIT: u32 = 26;
pub const FUSE_OPENDIR: u32 = 27;
pub const FUSE_READDIR: u32 = 28;
pub const FUSE_RELEASEDIR: u32 = 29;
pub const FUSE_FSYNCDIR: u32 = 30;
pub const FUSE_ACCESS: u32 = 34;
pub const FUSE_CREATE: u32 = 35;
pub const FUSE_TMPFILE: u32 = 51;
pub const FUSE_INTERRUPT: u32 = 36;
pub const FUSE_DESTROY: u32 = 38;
pub const FUSE_BATCH_FORGET: u32 = 42;
pub const FUSE_FALLOCATE: u32 = 43;
pub const FUSE_READDIRPLUS: u32 = 44;
pub const FUSE_RENAME2: u32 = 45;
pub const FUSE_IOCTL: u32 = 39;
pub const FUSE_LSEEK: u32 = 46;
/// sync(2)/syncfs(2) on the mount (protocol 7.34); see the server for which kernels send it.
pub const FUSE_SYNCFS: u32 = 50;

/// Notifications (a reply with unique 0 and this code in `error`): drop cached attributes.
pub const FUSE_NOTIFY_INVAL_INODE: i32 = 2;
pub const FUSE_NOTIFY_INVAL_ENTRY: i32 = 3;

// fuse_init_in/out flags (the upper 32 bits travel in flags2).
pub const FUSE_ASYNC_READ: u64 = 1 << 0;
pub const FUSE_BIG_WRITES: u64 = 1 << 5;
pub const FUSE_DO_READDIRPLUS: u64 = 1 << 13;
pub const FUSE_READDIRPLUS_AUTO: u64 = 1 << 14;
pub const FUSE_WRITEBACK_CACHE: u64 = 1 << 16;
pub const FUSE_PARALLEL_DIROPS: u64 = 1 << 18;
pub const FUSE_POSIX_ACL: u64 = 1 << 20;
pub const FUSE_DONT_MASK: u64 = 1 << 6;
pub const FUSE_MAX_PAGES: u64 = 1 << 22;
pub const FUSE_INIT_EXT: u64 = 1 << 30;
pub const FUSE_OVER_IO_URING: u64 = 1 << 41;

// fuse_setattr_in.valid
pub const FATTR_MODE: u32 = 1 << 0;
pub const FATTR_UID: u32 = 1 << 1;
pub const FATTR_GID: u32 = 1 << 2;
pub const FATTR_SIZE: u32 = 1 << 3;
pub const FATTR_ATIME: u32 = 1 << 4;
pub const FATTR_MTIME: u32 = 1 << 5;
pub const FATTR_ATIME_NOW: u32 = 1 << 7;
pub const FATTR_MTIME_NOW: u32 = 1 << 8;
pub const FATTR_CTIME: u32 = 1 << 10;

/// fuse_write_in.write_flags: the writer lacks CAP_FSETID (clear setuid/setgid).
pub const FUSE_WRITE_KILL_SUIDGID: u32 = 1 << 2;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap())
}

/// `struct fuse_in_header`.
#[derive(Clone, Copy, Debug)]
pub struct InHeader {
    /// Whole request: header, arguments and extensions.
    pub len: u32,
    pub opcode: u32,
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    /// The caller's process (0 for what the kernel sends on its own account).
    pub pid: u32,
}

impl InHeader {
    pub fn parse(b: &[u8]) -> Option<InHeader> {
        (b.len() >= IN_HEADER_LEN).then(|| InHeader {
            len: u32_at(b, 0),
            opcode: u32_at(b, 4),
            unique: u64_at(b, 8),
            nodeid: u64_at(b, 16),
            uid: u32_at(b, 24),
            gid: u32_at(b, 28),
            pid: u32_at(b, 32),
        })
    }
}

/// `struct fuse_setattr_in`: which fields to change (`valid`) and their values.
#[derive(Clone, Copy, Debug, Default)]
pub struct SetattrIn {
    pub valid: u32,
    pub size: u64,
    pub atime: (u64, u32),
    pub mtime: (u64, u32),
    pub ctime: (u64, u32),
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// One request's operation and its arguments. Names borrow from the request.
#[derive(Debug)]
pub enum Op<'a> {
    Init {
        major: u32,
        minor: u32,
        max_readahead: u32,
        flags: u64,
    },
    Destroy,
    Lookup {
        name: &'a [u8],
    },
    Forget {
        nlookup: u64,
    },
    /// `fuse_forget_one` records: node id and lookup count, 16 bytes each.
    BatchForget {
        records: &'a [u8],
    },
    Getattr,
    Setattr(SetattrIn),
    Readlink,
    Symlink {
        name: &'a [u8],
        target: &'a [u8],
    },
    Mknod {
        mode: u32,
        rdev: u32,
        umask: u32,
        name: &'a [u8],
    },
    Mkdir {
        mode: u32,
        umask: u32,
        name: &'a [u8],
    },
    Unlink {
        name: &'a [u8],
    },
    Rmdir {
        name: &'a [u8],
    },
    Rename {
        newdir: u64,
        flags: u32,
        name: &'a [u8],
        newname: &'a [u8],
    },
    Link {
        oldnodeid: u64,
        name: &'a [u8],
    },
    Open,
    /// Create and open in one (answered ENOSYS: see the server).
    Create,
    /// O_TMPFILE: a new file with no name, opened (`struct fuse_create_in`).
    Tmpfile {
        flags: u32,
        mode: u32,
        umask: u32,
    },
    Read {
        offset: u64,
        size: u32,
        /// The open flags of the file read through (fuse_read_in.flags).
        open_flags: u32,
    },
    Write {
        offset: u64,
        write_flags: u32,
        data: &'a [u8],
    },
    Statfs,
    Release,
    Flush,
    Fsync,
    Setxattr {
        flags: u32,
        name: &'a [u8],
        value: &'a [u8],
    },
    Getxattr {
        size: u32,
        name: &'a [u8],
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a [u8],
    },
    Opendir,
    Readdir {
        fh: u64,
        offset: u64,
        size: u32,
        plus: bool,
    },
    Releasedir {
        fh: u64,
    },
    Fsyncdir,
    Access,
    Interrupt,
    Fallocate {
        offset: u64,
        length: u64,
        mode: u32,
    },
    Lseek {
        offset: u64,
        whence: u32,
    },
    /// sync(2) or syncfs(2) of the whole mount.
    Syncfs,
    /// An ioctl of a regular file or directory (the kernel sends lsattr's
    /// and chattr's, FS_IOC_GETFLAGS and FS_IOC_SETFLAGS, as these).
    Ioctl {
        cmd: u32,
        input: &'a [u8],
        out_size: u32,
    },
    /// An operation this server does not implement (answered ENOSYS).
    Other,
}

/// Size of the fixed argument struct that follows the header for `opcode`
/// (what the io_uring ring puts in its op_in area).
pub fn fixed_args_len(opcode: u32) -> usize {
    match opcode {
        FUSE_INIT => 64,
        FUSE_FORGET | FUSE_LINK | FUSE_RENAME | FUSE_INTERRUPT => 8,
        FUSE_BATCH_FORGET | FUSE_MKDIR | FUSE_OPEN | FUSE_OPENDIR | FUSE_GETXATTR | FUSE_LISTXATTR | FUSE_ACCESS => 8,
        FUSE_GETATTR | FUSE_MKNOD | FUSE_RENAME2 | FUSE_CREATE | FUSE_TMPFILE | FUSE_FSYNC | FUSE_FSYNCDIR => 16,
        FUSE_SETXATTR => 8,
        FUSE_RELEASE | FUSE_RELEASEDIR | FUSE_FLUSH | FUSE_LSEEK => 24,
        FUSE_FALLOCATE | FUSE_IOCTL => 32,
        FUSE_SYNCFS => 8,
        FUSE_READ | FUSE_WRITE | FUSE_READDIR | FUSE_READDIRPLUS => 40,
        FUSE_SETATTR => 88,
        _ => 0,
    }
}

/// Why a request could not be parsed; the reply is EINVAL (or EPROTO at init).
#[derive(Debug)]
pub struct Malformed(pub &'static str);

/// A NUL-terminated name at the start of `b`, and what follows it.
fn name_at(b: &[u8]) -> Result<(&[u8], &[u8]), Malformed> {
    let end = b.iter().position(|&c| c == 0).ok_or(Malformed("a name without its NUL"))?;
    Ok((&b[..end], &b[end + 1..]))
}

fn time_at(b: &[u8], sec: usize, nsec: usize) -> (u64, u32) {
    (u64_at(b, sec), u32_at(b, nsec))
}

impl<'a> Op<'a> {
    /// Parses the arguments of `opcode`: `fixed` is at least `fixed_args_len`
    /// bytes, `rest` the variable data after it.
    pub fn parse(opcode: u32, fixed: &'a [u8], rest: &'a [u8]) -> Result<Op<'a>, Malformed> {
        if fixed.len() < fixed_args_len(opcode) {
            // INIT from protocols before 7.36 is shorter; it is refused by version.
            if opcode == FUSE_INIT && fixed.len() >= 16 {
                let (major, minor) = (u32_at(fixed, 0), u32_at(fixed, 4));
                return Ok(Op::Init { major, minor, max_readahead: u32_at(fixed, 8), flags: u32_at(fixed, 12) as u64 });
            }
            return Err(Malformed("arguments shorter than their struct"));
        }
        let f = fixed;
        Ok(match opcode {
            FUSE_INIT => {
                let mut flags = u32_at(f, 12) as u64;
                if flags & FUSE_INIT_EXT != 0 {
                    flags |= (u32_at(f, 16) as u64) << 32;
                }
                Op::Init { major: u32_at(f, 0), minor: u32_at(f, 4), max_readahead: u32_at(f, 8), flags }
            }
            FUSE_DESTROY => Op::Destroy,
            FUSE_LOOKUP => Op::Lookup { name: name_at(rest)?.0 },
            FUSE_FORGET => Op::Forget { nlookup: u64_at(f, 0) },
            FUSE_BATCH_FORGET => {
                let count = u32_at(f, 0) as usize;
                let records = rest.get(..count.saturating_mul(16)).ok_or(Malformed("batch forget past its end"))?;
                Op::BatchForget { records }
            }
            FUSE_GETATTR => Op::Getattr,
            FUSE_SETATTR => Op::Setattr(SetattrIn {
                valid: u32_at(f, 0),
                size: u64_at(f, 16),
                atime: time_at(f, 32, 56),
                mtime: time_at(f, 40, 60),
                ctime: time_at(f, 48, 64),
                mode: u32_at(f, 68),
                uid: u32_at(f, 76),
                gid: u32_at(f, 80),
            }),
            FUSE_READLINK => Op::Readlink,
            FUSE_SYMLINK => {
                let (name, after) = name_at(rest)?;
                Op::Symlink { name, target: name_at(after)?.0 }
            }
            FUSE_MKNOD => {
                Op::Mknod { mode: u32_at(f, 0), rdev: u32_at(f, 4), umask: u32_at(f, 8), name: name_at(rest)?.0 }
            }
            FUSE_MKDIR => Op::Mkdir { mode: u32_at(f, 0), umask: u32_at(f, 4), name: name_at(rest)?.0 },
            FUSE_UNLINK => Op::Unlink { name: name_at(rest)?.0 },
            FUSE_RMDIR => Op::Rmdir { name: name_at(rest)?.0 },
            FUSE_RENAME | FUSE_RENAME2 => {
                let (name, after) = name_at(rest)?;
                let flags = if opcode == FUSE_RENAME2 { u32_at(f, 8) } else { 0 };
                Op::Rename { newdir: u64_at(f, 0), flags, name, newname: name_at(after)?.0 }
            }
            FUSE_LINK => Op::Link { oldnodeid: u64_at(f, 0), name: name_at(rest)?.0 },
            FUSE_OPEN => Op::Open,
            FUSE_CREATE => Op::Create,
            FUSE_TMPFILE => Op::Tmpfile { flags: u32_at(f, 0), mode: u32_at(f, 4), umask: u32_at(f, 8) },
            FUSE_READ => Op::Read { offset: u64_at(f, 8), size: u32_at(f, 16), open_flags: u32_at(f, 32) },
            FUSE_WRITE => {
                let size = u32_at(f, 16) as usize;
                let data = rest.get(..size).ok_or(Malformed("write data shorter than its size"))?;
                Op::Write { offset: u64_at(f, 8), write_flags: u32_at(f, 20), data }
            }
            FUSE_STATFS => Op::Statfs,
            FUSE_SYNCFS => Op::Syncfs,
            FUSE_RELEASE => Op::Release,
            FUSE_FLUSH => Op::Flush,
            FUSE_FSYNC => Op::Fsync,
            FUSE_SETXATTR => {
                let size = u32_at(f, 0) as usize;
                let (name, after) = name_at(rest)?;
                let value = after.get(..size).ok_or(Malformed("xattr value shorter than its size"))?;
                Op::Setxattr { flags: u32_at(f, 4), name, value }
            }
            FUSE_GETXATTR => Op::Getxattr { size: u32_at(f, 0), name: name_at(rest)?.0 },
            FUSE_LISTXATTR => Op::Listxattr { size: u32_at(f, 0) },
            FUSE_REMOVEXATTR => Op::Removexattr { name: name_at(rest)?.0 },
            FUSE_OPENDIR => Op::Opendir,
            FUSE_READDIR | FUSE_READDIRPLUS => Op::Readdir {
                fh: u64_at(f, 0),
                offset: u64_at(f, 8),
                size: u32_at(f, 16),
                plus: opcode == FUSE_READDIRPLUS,
            },
            FUSE_RELEASEDIR => Op::Releasedir { fh: u64_at(f, 0) },
            FUSE_FSYNCDIR => Op::Fsyncdir,
            FUSE_ACCESS => Op::Access,
            FUSE_INTERRUPT => Op::Interrupt,
            FUSE_FALLOCATE => Op::Fallocate { offset: u64_at(f, 8), length: u64_at(f, 16), mode: u32_at(f, 24) },
            FUSE_LSEEK => Op::Lseek { offset: u64_at(f, 8), whence: u32_at(f, 16) },
            FUSE_IOCTL => {
                let in_size = u32_at(f, 24) as usize;
                let input = rest.get(..in_size).ok_or(Malformed("ioctl input shorter than its size"))?;
                Op::Ioctl { cmd: u32_at(f, 12), input, out_size: u32_at(f, 28) }
            }
            _ => Op::Other,
        })
    }
}

/// The `fuse_forget_one` records of a BATCH_FORGET: (node id, lookups dropped).
pub fn forget_records(records: &[u8]) -> impl Iterator<Item = (u64, u64)> + '_ {
    records.chunks_exact(16).map(|r| (u64_at(r, 0), u64_at(r, 8)))
}

/// Writes `struct fuse_out_header` into the first 16 bytes of `b`.
pub fn put_out_header(b: &mut [u8], len: u32, error: i32, unique: u64) {
    b[0..4].copy_from_slice(&len.to_ne_bytes());
    b[4..8].copy_from_slice(&error.to_ne_bytes());
    b[8..16].copy_from_slice(&unique.to_ne_bytes());
}

/// FUSE_NOTIFY_INVAL_INODE for `nodeid`, as written to /dev/fuse: the kernel
/// drops the inode's cached attributes (offset -1: and no cached pages).
pub fn inval_inode_notification(nodeid: u64) -> [u8; OUT_HEADER_LEN + 24] {
    let mut b = [0u8; OUT_HEADER_LEN + 24];
    put_out_header(&mut b, (OUT_HEADER_LEN + 24) as u32, FUSE_NOTIFY_INVAL_INODE, 0);
    b[OUT_HEADER_LEN..OUT_HEADER_LEN + 8].copy_from_slice(&nodeid.to_ne_bytes());
    b[OUT_HEADER_LEN + 8..OUT_HEADER_LEN + 16].copy_from_slice(&(-1i64).to_ne_bytes());
    b
}

/// FUSE_NOTIFY_INVAL_ENTRY for `name` in directory `parent`, as written to
/// /dev/fuse (`struct fuse_notify_inval_entry_out`: parent, namelen, flags,
/// then the name and a NUL): the kernel drops the dentry and, below a
/// directory, every dentry it cached there.
pub fn inval_entry_notification(parent: u64, name: &[u8]) -> Vec<u8> {
    let len = OUT_HEADER_LEN + 16 + name.len() + 1;
    let mut b = vec![0u8; len];
    put_out_header(&mut b, len as u32, FUSE_NOTIFY_INVAL_ENTRY, 0);
    b[OUT_HEADER_LEN..OUT_HEADER_LEN + 8].copy_from_slice(&parent.to_ne_bytes());
    b[OUT_HEADER_LEN + 8..OUT_HEADER_LEN + 12].copy_from_slice(&(name.len() as u32).to_ne_bytes());
    b[OUT_HEADER_LEN + 16..OUT_HEADER_LEN + 16 + name.len()].copy_from_slice(name);
    b
}

/// `struct fuse_attr` (88 bytes), the attributes every entry and attr reply carries.
#[derive(Clone, Copy, Debug, Default)]
pub struct Attr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    pub atime: (u64, u32),
    pub mtime: (u64, u32),
    pub ctime: (u64, u32),
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

pub const ATTR_LEN: usize = 88;
pub const ENTRY_OUT_LEN: usize = 40 + ATTR_LEN;
pub const INIT_OUT_LEN: usize = 64;
pub const DIRENT_HEADER_LEN: usize = 24;

/// A reply's payload under construction: a fixed-capacity area (the kernel's
/// buffer for this request, or the ring's payload area) filled from the front.
pub struct Payload<'b> {
    buf: &'b mut [u8],
    len: usize,
}

impl<'b> Payload<'b> {
    pub fn new(buf: &'b mut [u8]) -> Payload<'b> {
        Payload { buf, len: 0 }
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }
    #[cfg(test)]
    fn clear(&mut self) {
        self.len = 0;
    }
    /// The unused tail, for a caller that fills it in place (a read) and then
    /// calls `advance`.
    pub fn spare(&mut self) -> &mut [u8] {
        &mut self.buf[self.len..]
    }
    pub fn advance(&mut self, n: usize) {
        self.len = (self.len + n).min(self.buf.len());
    }
    /// Appends `bytes`; false (nothing written) when they do not fit.
    pub fn put(&mut self, bytes: &[u8]) -> bool {
        if self.buf.len() - self.len < bytes.len() {
            return false;
        }
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
        true
    }
    fn u16(&mut self, v: u16) {
        self.put(&v.to_ne_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.put(&v.to_ne_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.put(&v.to_ne_bytes());
    }

    fn attr(&mut self, a: &Attr) {
        for v in [a.ino, a.size, a.blocks, a.atime.0, a.mtime.0, a.ctime.0] {
            self.u64(v);
        }
        for v in [a.atime.1, a.mtime.1, a.ctime.1, a.mode, a.nlink, a.uid, a.gid, a.rdev, a.blksize, 0] {
            self.u32(v);
        }
    }

    /// `struct fuse_entry_out`: node id, generation, validity of the name and
    /// of the attributes (seconds, nanoseconds), attributes.
    pub fn entry_out(&mut self, a: &Attr, generation: u64, valid: (u64, u32)) {
        for v in [a.ino, generation, valid.0, valid.0] {
            self.u64(v);
        }
        self.u32(valid.1);
        self.u32(valid.1);
        self.attr(a);
    }

    /// `struct fuse_attr_out`.
    pub fn attr_out(&mut self, a: &Attr, valid: (u64, u32)) {
        self.u64(valid.0);
        self.u32(valid.1);
        self.u32(0);
        self.attr(a);
    }

    /// `struct fuse_open_out`.
    pub fn open_out(&mut self, fh: u64, open_flags: u32) {
        self.u64(fh);
        self.u32(open_flags);
        self.u32(0);
    }

    /// `struct fuse_init_out`; `flags` carries the upper half for flags2.
    pub fn init_out(&mut self, minor: u32, max_readahead: u32, flags: u64, max_background: u16, max_write: u32) {
        self.u32(FUSE_KERNEL_VERSION);
        self.u32(minor);
        self.u32(max_readahead);
        self.u32(flags as u32);
        self.u16(max_background);
        self.u16(max_background * 3 / 4); // congestion_threshold, the kernel's own ratio
        self.u32(max_write);
        self.u32(1); // time_gran: nanoseconds
        self.u16(max_write.div_ceil(4096) as u16); // max_pages
        self.u16(0); // map_alignment
        self.u32((flags >> 32) as u32);
        for _ in 0..7 {
            self.u32(0);
        }
    }

    /// `struct fuse_statfs_out` (a `fuse_kstatfs`).
    #[allow(clippy::too_many_arguments)]
    pub fn statfs_out(
        &mut self,
        blocks: u64,
        bfree: u64,
        bavail: u64,
        files: u64,
        ffree: u64,
        bsize: u32,
        namelen: u32,
    ) {
        for v in [blocks, bfree, bavail, files, ffree] {
            self.u64(v);
        }
        for v in [bsize, namelen, bsize, 0, 0, 0, 0, 0, 0, 0] {
            self.u32(v);
        }
    }

    /// `struct fuse_write_out` and `fuse_getxattr_out` share this shape.
    pub fn size_out(&mut self, size: u32) {
        self.u32(size);
        self.u32(0);
    }

    /// `struct fuse_ioctl_out` (a result, no retry), then the output bytes.
    pub fn ioctl_out(&mut self, result: i32, output: &[u8]) {
        self.u32(result as u32);
        self.u32(0);
        self.u32(0);
        self.u32(0);
        self.put(output);
    }

    /// `struct fuse_lseek_out`.
    pub fn lseek_out(&mut self, offset: u64) {
        self.u64(offset);
    }

    /// One `struct fuse_dirent`, padded to 8 bytes; false when it does not fit
    /// (nothing written).
    pub fn dirent(&mut self, ino: u64, next_offset: u64, kind: u32, name: &[u8]) -> bool {
        let len = (DIRENT_HEADER_LEN + name.len() + 7) & !7;
        if self.buf.len() - self.len < len {
            return false;
        }
        self.u64(ino);
        self.u64(next_offset);
        self.u32(name.len() as u32);
        self.u32(kind);
        self.put(name);
        let pad = len - DIRENT_HEADER_LEN - name.len();
        self.put(&[0u8; 8][..pad]);
        true
    }

    /// One `struct fuse_direntplus` (an entry_out, then a dirent); false when
    /// it does not fit.
    pub fn direntplus(
        &mut self,
        a: &Attr,
        generation: u64,
        valid: (u64, u32),
        next_offset: u64,
        kind: u32,
        name: &[u8],
    ) -> bool {
        let len = ENTRY_OUT_LEN + ((DIRENT_HEADER_LEN + name.len() + 7) & !7);
        if self.buf.len() - self.len < len {
            return false;
        }
        self.entry_out(a, generation, valid);
        self.dirent(a.ino, next_offset, kind, name)
    }

    /// A READDIRPLUS entry without attributes: node id 0 tells the kernel the
    /// server gives no attributes for it (fuse's parse_dirplusfile then emits
    /// the name alone, and a later lookup asks again), for an entry whose
    /// inode cannot be read.
    pub fn direntplus_unattributed(&mut self, ino: u64, next_offset: u64, kind: u32, name: &[u8]) -> bool {
        let len = ENTRY_OUT_LEN + ((DIRENT_HEADER_LEN + name.len() + 7) & !7);
        if self.buf.len() - self.len < len {
            return false;
        }
        self.entry_out(&Attr::default(), 0, (0, 0));
        self.dirent(ino, next_offset, kind, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(opcode: u32, len: usize) -> Vec<u8> {
        let mut h = vec![0u8; IN_HEADER_LEN];
        h[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
        h[4..8].copy_from_slice(&opcode.to_ne_bytes());
        h[8..16].copy_from_slice(&77u64.to_ne_bytes());
        h[16..24].copy_from_slice(&5u64.to_ne_bytes());
        h
    }

    #[test]
    fn requests_parse_at_their_offsets() {
        let h = InHeader::parse(&header(FUSE_LOOKUP, 45)).unwrap();
        assert_eq!((h.len, h.opcode, h.unique, h.nodeid), (45, FUSE_LOOKUP, 77, 5));

        let mut rename = 9u64.to_ne_bytes().to_vec();
        rename.extend_from_slice(&1u32.to_ne_bytes());
        rename.extend_from_slice(&[0; 4]);
        let Op::Rename { newdir, flags, name, newname } = Op::parse(FUSE_RENAME2, &rename, b"a\0bc\0").unwrap() else {
            panic!()
        };
        assert_eq!((newdir, flags, name, newname), (9, 1, &b"a"[..], &b"bc"[..]));

        let mut write = vec![0u8; 40];
        write[8..16].copy_from_slice(&4096u64.to_ne_bytes());
        write[16..20].copy_from_slice(&3u32.to_ne_bytes());
        write[20..24].copy_from_slice(&FUSE_WRITE_KILL_SUIDGID.to_ne_bytes());
        let Op::Write { offset, write_flags, data, .. } = Op::parse(FUSE_WRITE, &write, b"xyzextra").unwrap() else {
            panic!()
        };
        assert_eq!((offset, write_flags, data), (4096, FUSE_WRITE_KILL_SUIDGID, &b"xyz"[..]));

        let mut setattr = vec![0u8; 88];
        setattr[0..4].copy_from_slice(&(FATTR_MODE | FATTR_MTIME).to_ne_bytes());
        setattr[40..48].copy_from_slice(&1234u64.to_ne_bytes());
        setattr[60..64].copy_from_slice(&99u32.to_ne_bytes());
        setattr[68..72].copy_from_slice(&0o100640u32.to_ne_bytes());
        let Op::Setattr(s) = Op::parse(FUSE_SETATTR, &setattr, &[]).unwrap() else { panic!() };
        assert_eq!((s.valid, s.mtime, s.mode), (FATTR_MODE | FATTR_MTIME, (1234, 99), 0o100640));
    }

    #[test]
    fn truncated_and_unterminated_arguments_are_refused() {
        assert!(Op::parse(FUSE_LOOKUP, &[], b"no-nul").is_err());
        assert!(Op::parse(FUSE_READ, &[0; 20], &[]).is_err());
        let mut write = vec![0u8; 40];
        write[16..20].copy_from_slice(&100u32.to_ne_bytes());
        assert!(Op::parse(FUSE_WRITE, &write, b"short").is_err());
        let mut batch = vec![0u8; 8];
        batch[0..4].copy_from_slice(&u32::MAX.to_ne_bytes());
        assert!(Op::parse(FUSE_BATCH_FORGET, &batch, &[0; 32]).is_err());
    }

    #[test]
    fn replies_have_the_kernels_sizes() {
        let mut buf = vec![0u8; 4096];
        let mut p = Payload::new(&mut buf);
        p.entry_out(&Attr::default(), 0, (1, 0));
        assert_eq!(p.len(), ENTRY_OUT_LEN);
        p.clear();
        p.attr_out(&Attr::default(), (1, 0));
        assert_eq!(p.len(), 16 + ATTR_LEN);
        p.clear();
        p.init_out(42, 0, FUSE_INIT_EXT | FUSE_OVER_IO_URING, 64, 1 << 20);
        assert_eq!(p.len(), INIT_OUT_LEN);
        assert_eq!(u32_at(&buf, 32), (FUSE_OVER_IO_URING >> 32) as u32, "flags2");
        let mut p = Payload::new(&mut buf);
        p.statfs_out(1, 2, 3, 4, 5, 4096, 255);
        assert_eq!(p.len(), 80);
        p.clear();
        assert!(p.dirent(12, 1, 8, b"abc"));
        assert_eq!(p.len(), 32, "24-byte header, 3-byte name, padded to 8");
        let mut small = [0u8; 30];
        assert!(!Payload::new(&mut small).dirent(12, 1, 8, b"abc"), "a dirent that does not fit is left out");
    }
}
