//! The jail's network namespace with `network.mode: allowlist`: the child
//! side of the proxy.
//!
//! The net namespace has only loopback in every mode. With `allowlist`, the
//! jail's PID 1 (still privileged in its namespaces, before the worker is
//! forked) brings `lo` up, listens on `127.0.0.1:PROXY_PORT` and hands the
//! listening socket to the supervisor over a unix socketpair (SCM_RIGHTS).
//! The supervisor accepts on it from outside (proxy.rs): connections come
//! from the jail's namespace, the proxy's own upstream sockets live in the
//! host's. No forwarder process runs inside the jail, and the script's
//! environment points `HTTP_PROXY`/`HTTPS_PROXY` at that port
//! ([`proxy_env`]). With `none`, none of this happens: `lo` stays down and
//! nothing listens.

use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::os::fd::{AsFd, BorrowedFd};

use crate::sys;

/// The port the proxy listens on inside the jail. The namespace is the
/// jail's own, so a fixed port never collides with anything.
pub(crate) const PROXY_PORT: u16 = 3128;

/// What the script's environment says about the proxy.
pub(crate) fn proxy_url() -> String {
    format!("http://127.0.0.1:{PROXY_PORT}")
}

/// The variables that send Python's urllib, requests, httpx, pip and curl
/// through the proxy. `NO_PROXY` is empty: nothing bypasses it (and
/// nothing could: there is no other route out).
pub(crate) fn proxy_env() -> Vec<(String, String)> {
    let url = proxy_url();
    let mut env = Vec::new();
    for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        env.push((name.to_string(), url.clone()));
    }
    for name in ["NO_PROXY", "no_proxy"] {
        env.push((name.to_string(), String::new()));
    }
    env
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum NetworkError {
    #[error("bring the loopback interface up (SIOCSIFFLAGS lo IFF_UP)")]
    LoopbackUp(#[source] std::io::Error),
    #[error("listen on 127.0.0.1:{PROXY_PORT} (socket, bind, listen)")]
    Listen(#[source] std::io::Error),
    #[error("send the proxy listener to the supervisor")]
    Send(#[source] std::io::Error),
}

/// Child side (PID 1, before the worker is forked): bring `lo` up, listen
/// on the proxy port, and send the listener to the supervisor. Our own copy
/// closes on return, so only the supervisor ever accepts on it.
pub(crate) fn hand_over_listener(to_supervisor: BorrowedFd<'_>) -> Result<(), NetworkError> {
    sys::loopback_up().map_err(NetworkError::LoopbackUp)?;
    // std's bind is socket(CLOEXEC) + bind + listen(128).
    let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, PROXY_PORT)).map_err(NetworkError::Listen)?;
    sys::send_fd(to_supervisor, listener.as_fd()).map_err(NetworkError::Send)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_proxy_variable_points_at_the_loopback_port_and_nothing_bypasses_it() {
        let env: std::collections::BTreeMap<_, _> = proxy_env().into_iter().collect();
        for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
            assert_eq!(env[k], "http://127.0.0.1:3128");
        }
        assert_eq!(env["NO_PROXY"], "");
        assert_eq!(env["no_proxy"], "");
    }
}
