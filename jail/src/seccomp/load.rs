//! Load: the child side, last before execve. The compiled program goes
//! into this single-threaded process; in notify mode the kernel's listener
//! goes straight to the supervisor.

use std::os::fd::OwnedFd;

use super::compile::{Filter, Mode};
use super::SeccompError;
use crate::sys;

/// `SECCOMP_FILTER_FLAG_NEW_LISTENER`: return a user-notification listener.
const FLAG_NEW_LISTENER: u32 = 1 << 3;
/// `SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV` (Linux 5.19): once the supervisor
/// has read a notification, only a fatal signal interrupts the wait, so a
/// signal cannot make the kernel retry (and us count) one call twice.
const FLAG_WAIT_KILLABLE_RECV: u32 = 1 << 5;

impl Filter {
    /// Child side: load the filter into this (single-threaded) process. In
    /// notify mode the kernel hands back the listener, which goes to the
    /// supervisor over `to_supervisor` before anything else can be refused.
    pub fn load(&self, to_supervisor: Option<&OwnedFd>) -> Result<(), SeccompError> {
        let prog: Vec<libc::sock_filter> = self
            .program
            .iter()
            .map(|i| libc::sock_filter { code: i.code, jt: i.jt, jf: i.jf, k: i.k })
            .collect();
        let listener = match (self.mode, to_supervisor) {
            (Mode::Notify, Some(sock)) => {
                let listener = match sys::seccomp_set_mode_filter(&prog, FLAG_NEW_LISTENER | FLAG_WAIT_KILLABLE_RECV) {
                    // Kernels before 5.19 do not know the flag.
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => sys::seccomp_set_mode_filter(&prog, FLAG_NEW_LISTENER),
                    other => other,
                }
                .map_err(SeccompError::Load)?;
                Some((listener, sock))
            }
            _ => {
                sys::seccomp_set_mode_filter(&prog, 0).map_err(SeccompError::Load)?;
                None
            }
        };
        if let Some((Some(fd), sock)) = listener {
            // Refused calls block until the supervisor holds this: it must be
            // the very next thing we do, and sendmsg must be allowed
            // (Model::check_jail_needs).
            sys::send_fd(std::os::fd::AsFd::as_fd(sock), std::os::fd::AsFd::as_fd(&fd)).map_err(SeccompError::SendListener)?;
        }
        Ok(())
    }
}
