//! The few errors uext4 reports to its callers.
//!
//! Each variant is a semantic class a caller can act on (FUSE maps them to errno);
//! the details a human needs live in the strings inside.

use std::fmt;

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
    /// A caller's argument that makes no sense (a file used as a directory, a bad size, ...).
    Invalid(String),
    /// A write on a filesystem opened read-only.
    ReadOnly(String),
    /// The host refused an I/O request.
    Io(std::io::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn corrupt(what: impl Into<String>, location: impl Into<String>) -> Error {
        Error::Corrupt { what: what.into(), location: location.into() }
    }

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
            Error::Invalid(_) => 22,         // EINVAL
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
            Error::Invalid(s) => write!(f, "invalid: {s}"),
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
