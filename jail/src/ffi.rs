//! The one function another process calls into: a template's fork entry
//! (template/fork.rs), exported by this crate's cdylib (`libjail.so`).
//! Its `unsafe` is the conversion of the raw arguments, each block with
//! its `// SAFETY:` line as in sys.rs; everything else is safe code
//! elsewhere.

use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd};

/// The template's entry (template/fork.rs, `entry`), exported by this
/// crate's cdylib (`libjail.so`), which template.py loads with
/// `ctypes.PyDLL` and calls once per request, the interpreter's lock held:
/// `msg` and `len` the request's message, in the caller's buffer of `cap`
/// bytes (zeroed once read; in the fork's worker it then holds the
/// interpreter's argv and environment, `*out` bytes of JSON), `fds` and
/// `nfds` the descriptors that came with it (ours from here on, closed or
/// handed to the fork), `conn` the request's connection (borrowed).
/// Returns the fork's pid in the template, 0 in the fork's worker, -1 when
/// no fork was made.
///
/// # Safety
///
/// `msg` must point to `cap` writable bytes, `len` of them the message,
/// `fds` to `nfds` ints, each an open descriptor the caller gives up, and
/// `out` to a writable `size_t`; `conn` must be open.
#[no_mangle]
pub unsafe extern "C" fn jail_template_fork(
    msg: *mut u8,
    len: usize,
    cap: usize,
    fds: *const libc::c_int,
    nfds: usize,
    conn: libc::c_int,
    out: *mut usize,
) -> libc::c_int {
    if msg.is_null() || out.is_null() || fds.is_null() && nfds > 0 || len > cap || cap > crate::template::MAX_MESSAGE || nfds > 64
    {
        return -1;
    }
    // SAFETY: the caller passes a buffer of `cap` writable bytes at `msg`
    // (template.py: the bytearray it received into), checked non-null
    // above, which nothing else touches during the call.
    let buf = unsafe { std::slice::from_raw_parts_mut(msg, cap) };
    let raw: &[libc::c_int] = if nfds == 0 {
        &[]
    } else {
        // SAFETY: as for `msg`: `nfds` ints at `fds`, checked non-null.
        unsafe { std::slice::from_raw_parts(fds, nfds) }
    };
    // SAFETY: each is an open descriptor the caller received with the
    // request and gives up to us (template.py never closes them itself).
    let owned: Vec<OwnedFd> = raw.iter().map(|&fd| unsafe { OwnedFd::from_raw_fd(fd) }).collect();
    // SAFETY: the connection stays open for the whole call (template.py
    // holds its socket object).
    let conn = unsafe { BorrowedFd::borrow_raw(conn) };
    let (pid, said) = crate::template::fork::entry(buf, len, owned, conn);
    // SAFETY: checked non-null above; the caller's `size_t`.
    unsafe { *out = said };
    pid
}
