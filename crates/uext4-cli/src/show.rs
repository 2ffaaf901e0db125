//! What the CLI prints that it did not write itself: names read from an image, and
//! failures.
//!
//! Names come from images that may be hostile, so nothing from an image reaches the
//! terminal raw: control bytes (C0, DEL and the C1 range), bytes that are not UTF-8
//! and the backslash are escaped as `ls -b` escapes them (`\n`, `\033`, `\\`), which
//! keeps every distinct name distinct. Failures take GNU coreutils' shape,
//! `COMMAND: cannot ACT 'OPERAND': Reason (detail)`, where Reason is the errno text of
//! the library's typed error, so a message names both the operand and what is wrong.

use uext4::Error;

/// `bytes` with every byte a terminal could act on escaped.
pub fn escape(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    let mut rest = bytes;
    while !rest.is_empty() {
        let (valid, bad) = match std::str::from_utf8(rest) {
            Ok(s) => (s, &[][..]),
            Err(e) => {
                let (good, after) = rest.split_at(e.valid_up_to());
                let bad_len = e.error_len().unwrap_or(after.len());
                (std::str::from_utf8(good).unwrap_or_default(), &after[..bad_len])
            }
        };
        for c in valid.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\x07' => out.push_str("\\a"),
                '\x08' => out.push_str("\\b"),
                '\t' => out.push_str("\\t"),
                '\n' => out.push_str("\\n"),
                '\x0b' => out.push_str("\\v"),
                '\x0c' => out.push_str("\\f"),
                '\r' => out.push_str("\\r"),
                c if c.is_control() => {
                    let mut buf = [0u8; 4];
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.push_str(&format!("\\{b:03o}"));
                    }
                }
                c => out.push(c),
            }
        }
        for b in bad {
            out.push_str(&format!("\\{b:03o}"));
        }
        rest = &rest[valid.len() + bad.len()..];
    }
    out
}

/// An operand as messages quote it (escaped with the rest of the message).
pub fn quoted(s: &str) -> String {
    format!("'{s}'")
}

/// A command's failure: one or more lines, each printed escaped after "uext4: ".
#[derive(Debug)]
pub struct Failure {
    pub lines: Vec<String>,
    /// The library refused the command's first change, so nothing was changed
    /// and the writable open may be abandoned unwritten (`check_then_apply`).
    pub untouched: bool,
}

pub type CliResult<T> = std::result::Result<T, Failure>;

impl Failure {
    /// A refusal worded in full by the command.
    pub fn refused(line: impl Into<String>) -> Failure {
        Failure { lines: vec![line.into()], untouched: false }
    }

    /// `context` (the command and its operand) followed by what `e` says is wrong.
    pub fn about(context: &str, e: &Error) -> Failure {
        Failure { lines: vec![format!("{context}: {}", reason(e, context))], untouched: false }
    }

    /// Several failures found before anything was changed, reported together.
    pub fn all(failures: Vec<Failure>) -> Failure {
        Failure { lines: failures.into_iter().flat_map(|f| f.lines).collect(), untouched: false }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        Failure { lines: vec![e.to_string()], untouched: false }
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Failure {
        Failure::from(Error::Io(e))
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.lines.join("; "))
    }
}

/// The errno text of `e` ("File name too long"), then the library's detail in
/// parentheses unless `context` already says it.
fn reason(e: &Error, context: &str) -> String {
    if let Error::Io(io) = e {
        return host_reason(io);
    }
    let errno = host_reason(&std::io::Error::from_raw_os_error(e.errno()));
    let full = e.to_string();
    let detail = full.split_once(": ").map(|(_, d)| d).unwrap_or_default();
    if detail.is_empty() || context.contains(detail) {
        errno
    } else {
        format!("{errno} ({detail})")
    }
}

/// A host error's text without Rust's " (os error N)" tail.
pub fn host_reason(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.rfind(" (os error ") {
        Some(i) if text.ends_with(')') => text[..i].to_string(),
        _ => text,
    }
}

/// Whether `e` is a refusal the library makes before it changes anything (a
/// precondition such as EEXIST or ENOTEMPTY), rather than a failure part-way
/// (ENOSPC, corruption, I/O).
fn is_refusal(e: &Error) -> bool {
    matches!(
        e,
        Error::NotFound(_)
            | Error::Exists(_)
            | Error::NotEmpty(_)
            | Error::NotADirectory(_)
            | Error::IsADirectory(_)
            | Error::NameTooLong(_)
            | Error::TooManyLinks(_)
            | Error::SymlinkLoop(_)
            | Error::FileTooLarge(_)
            | Error::NotPermitted(_)
            | Error::Busy(_)
            | Error::Invalid(_)
            | Error::ReadOnly(_)
    )
}

/// Adds a command's context to a library error.
pub trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> CliResult<T>;

    /// As `context`, for a change: when nothing was changed before it and the
    /// library refused it, the failure says the image is untouched.
    fn change(self, changed_before: bool, what: impl FnOnce() -> String) -> CliResult<T>;
}

impl<T> Context<T> for uext4::Result<T> {
    fn context(self, what: impl FnOnce() -> String) -> CliResult<T> {
        self.map_err(|e| Failure::about(&what(), &e))
    }

    fn change(self, changed_before: bool, what: impl FnOnce() -> String) -> CliResult<T> {
        self.map_err(|e| Failure { untouched: !changed_before && is_refusal(&e), ..Failure::about(&what(), &e) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_a_terminal_acts_on() {
        assert_eq!(escape(b"plain name.txt"), "plain name.txt");
        assert_eq!(escape(b"a\nb\tc\x1b[31m"), "a\\nb\\tc\\033[31m");
        assert_eq!(escape(b"back\\slash"), "back\\\\slash");
        assert_eq!(escape(b"\x7f\xc2\x9b"), "\\177\\302\\233");
        assert_eq!(escape(b"caf\xc3\xa9 \xff\xfe"), "caf\u{e9} \\377\\376");
        assert!(escape(&(0u8..=255).collect::<Vec<u8>>()).bytes().all(|b| b >= 0x20 && b != 0x7f));
    }
}
