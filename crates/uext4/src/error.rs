//! The few errors uext4 reports to its callers.
//!
//! Each variant is a semantic class a caller can act on (FUSE maps them to errno,
//! one variant per errno the kernel's ext4 would give); the details a human needs
//! live in the strings inside. `Invalid` is for EINVAL only: a new errno gets a
//! variant of its own.

use std::fmt;

/// Everything uext4 can fail with: one variant per errno the kernel's ext4
/// gives in the same case (`errno()` maps them), each with a message naming
/// what was refused.
#[derive(Debug)]
pub enum Error {
    /// A path component or inode that does not exist.
    NotFound(String),
    /// A name that already exists where a new one was asked for.
    Exists(String),
    /// rmdir or rename-over of a directory that still has entries.
    NotEmpty(String),
    /// No free blocks or inodes left.
    NoSpace(String),
    /// On-disk data that breaks ext4's rules: `what` is wrong at `location`.
    Corrupt { what: String, location: String },
    /// A feature, inode kind or request this build does not handle.
    Unsupported { feature: String },
    /// A path component or inode used as a directory is not one (ENOTDIR).
    NotADirectory(String),
    /// A directory where a non-directory was required (EISDIR).
    IsADirectory(String),
    /// A name longer than 255 bytes (ENAMETOOLONG).
    NameTooLong(String),
    /// An inode already has the most links ext4 allows (EMLINK).
    TooManyLinks(String),
    /// Too many symbolic links met while resolving a path (ELOOP).
    SymlinkLoop(String),
    /// An offset or size past the largest file ext4 can map (EFBIG).
    FileTooLarge(String),
    /// An operation POSIX forbids outright, such as a hard link to a directory (EPERM).
    NotPermitted(String),
    /// The image is in use by someone else: a uext4 mount, the kernel (EBUSY); or
    /// a rename of '.' or '..'.
    Busy(String),
    /// A name or value past a fixed limit, such as an xattr name over 255 bytes (ERANGE).
    OutOfRange(String),
    /// An operation the inode's kind has no notion of, such as fallocate on a
    /// device node (ENODEV).
    NoDevice(String),
    /// Space operations on a pipe (ESPIPE).
    NotSeekable(String),
    /// A caller's argument that makes no sense (a bad size, bad flags, ...).
    Invalid(String),
    /// An argument past a size the interface allows, such as an xattr value
    /// over 64 KiB (E2BIG).
    TooBig(String),
    /// A request the object's kind refuses, such as a default ACL on a file
    /// (EACCES).
    AccessDenied(String),
    /// A write on a filesystem opened read-only.
    ReadOnly(String),
    /// The host refused an I/O request.
    Io(std::io::Error),
}

/// A result whose error is uext4's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// A `Corrupt` error: `what` is wrong at `location`.
    pub fn corrupt(what: impl Into<String>, location: impl Into<String>) -> Error {
        Error::Corrupt { what: what.into(), location: location.into() }
    }

    /// An `Unsupported` error naming `feature`.
    pub fn unsupported(feature: impl Into<String>) -> Error {
        Error::Unsupported { feature: feature.into() }
    }

    /// The errno a POSIX frontend should report for this error.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NotFound(_) => 2,         // ENOENT
            Error::Exists(_) => 17,          // EEXIST
            Error::NotEmpty(_) => 39,        // ENOTEMPTY
            Error::NoSpace(_) => 28,         // ENOSPC
            Error::Corrupt { .. } => 117,    // EUCLEAN, as the kernel reports EFSCORRUPTED
            Error::Unsupported { .. } => 95, // EOPNOTSUPP
            Error::NotADirectory(_) => 20,   // ENOTDIR
            Error::IsADirectory(_) => 21,    // EISDIR
            Error::NameTooLong(_) => 36,     // ENAMETOOLONG
            Error::TooManyLinks(_) => 31,    // EMLINK
            Error::SymlinkLoop(_) => 40,     // ELOOP
            Error::FileTooLarge(_) => 27,    // EFBIG
            Error::NotPermitted(_) => 1,     // EPERM
            Error::Busy(_) => 16,            // EBUSY
            Error::OutOfRange(_) => 34,      // ERANGE
            Error::NoDevice(_) => 19,        // ENODEV
            Error::NotSeekable(_) => 29,     // ESPIPE
            Error::Invalid(_) => 22,         // EINVAL
            Error::TooBig(_) => 7,           // E2BIG
            Error::AccessDenied(_) => 13,    // EACCES
            Error::ReadOnly(_) => 30,        // EROFS
            Error::Io(e) => e.raw_os_error().unwrap_or(5),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotFound(s) => write!(f, "not found: {s}"),
            Error::Exists(s) => write!(f, "already exists: {s}"),
            Error::NotEmpty(s) => write!(f, "directory not empty: {s}"),
            Error::NoSpace(s) => write!(f, "no space left: {s}"),
            Error::Corrupt { what, location } => {
                write!(f, "corrupt filesystem: {what} ({location})")
            }
            Error::Unsupported { feature } => write!(f, "unsupported: {feature}"),
            Error::NotADirectory(s) => write!(f, "not a directory: {s}"),
            Error::IsADirectory(s) => write!(f, "is a directory: {s}"),
            Error::NameTooLong(s) => write!(f, "file name too long: {s}"),
            Error::TooManyLinks(s) => write!(f, "too many links: {s}"),
            Error::SymlinkLoop(s) => write!(f, "too many levels of symbolic links: {s}"),
            Error::FileTooLarge(s) => write!(f, "file too large: {s}"),
            Error::NotPermitted(s) => write!(f, "operation not permitted: {s}"),
            Error::Busy(s) => write!(f, "in use: {s}"),
            Error::OutOfRange(s) => write!(f, "out of range: {s}"),
            Error::NoDevice(s) => write!(f, "not supported by this kind of inode: {s}"),
            Error::NotSeekable(s) => write!(f, "a pipe: {s}"),
            Error::Invalid(s) => write!(f, "invalid: {s}"),
            Error::TooBig(s) => write!(f, "too big: {s}"),
            Error::AccessDenied(s) => write!(f, "access denied: {s}"),
            Error::ReadOnly(s) => write!(f, "read-only: {s}"),
            Error::Io(e) => write!(f, "I/O error: {e}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Io(e)
    }
}

/// Where uext4 noticed an error and what it was, for the superblock's record:
/// the kernel writes the C function's name and the errno, uext4 names its step
/// (`func`, at most 32 bytes) and gives the errno (0 when not known).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ErrorSite {
    pub func: &'static str,
    pub errno: i32,
}
