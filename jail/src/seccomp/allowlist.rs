//! Allowlist adaptation: the default seccomp section rewritten for
//! `network.mode: allowlist`, so inet sockets reach the supervisor (which
//! lets the TCP stream ones through) instead of being refused outright.

use super::model::SeccompFile;

/// The default allowlist adapted to `network.mode: allowlist`: the rule that
/// refuses every family but AF_UNIX is replaced by rules that send socket()
/// for AF_INET and AF_INET6 to the supervisor, which lets a TCP stream
/// socket through (the script needs one to reach the proxy on 127.0.0.1)
/// and refuses every other type, and a rule that refuses every other
/// family outright. The type is checked by the supervisor, not compiled
/// into the filter: libseccomp 2.5 can hang merging rules that compare
/// different arguments of one syscall (see `Model::from_file`). What keeps
/// the TCP sockets in: the net namespace has only loopback, no resolver is
/// configured, and landlock (ABI >= 4) lets them connect only to the
/// proxy's port.
pub(crate) fn adapt_for_allowlist(section: &mut SeccompFile) {
    use super::model::{ActionFile, ConditionFile, Number, RuleFile};
    let refuses_non_unix = |r: &RuleFile| {
        r.syscalls == ["socket"]
            && matches!(r.action, ActionFile::Errno { .. })
            && r.when.len() == 1
            && r.when[0].arg == 0
            && r.when[0].op == "ne"
            && r.when[0].value.as_ref().and_then(|v| v.value().ok()) == Some(libc::AF_UNIX as u64)
    };
    let Some(at) = section.rules.iter().position(refuses_non_unix) else { return };
    let old = section.rules.remove(at);
    let family = |op: &str, value: Option<&str>, values: Option<Vec<&str>>| ConditionFile {
        arg: 0,
        op: op.into(),
        value: value.map(|v| Number::Text(v.into())),
        mask: None,
        values: values.map(|vs| vs.into_iter().map(|v| Number::Text(v.into())).collect()),
    };
    // Counted refusals reach the supervisor, which is what lets it pass
    // the TCP ones (`Tally::answer`).
    let refuse_to_supervisor = match &old.action {
        ActionFile::Errno { errno, .. } => ActionFile::Errno { errno: errno.clone(), report: Some(true) },
        other => other.clone(),
    };
    let mut rules = Vec::new();
    for fam in ["AF_INET", "AF_INET6"] {
        rules.push(RuleFile {
            syscalls: vec!["socket".into()],
            action: refuse_to_supervisor.clone(),
            when: vec![family("eq", Some(fam), None)],
            why: format!(
                "network.mode is allowlist: an {fam} socket is created only as a TCP stream socket (SOCK_STREAM, protocol 0 or \
                 IPPROTO_TCP), to reach the supervisor's proxy on loopback; the supervisor checks the type and refuses UDP, raw \
                 and every other kind"
            ),
        });
    }
    rules.push(RuleFile {
        syscalls: vec!["socket".into()],
        action: old.action.clone(),
        when: vec![family("not_in", None, Some(vec!["AF_UNIX", "AF_INET", "AF_INET6"]))],
        why: "network.mode is allowlist: only AF_UNIX, AF_INET and AF_INET6 sockets can be created; AF_NETLINK, AF_PACKET, AF_VSOCK and every other family are refused".into(),
    });
    for (i, r) in rules.into_iter().enumerate() {
        section.rules.insert(at + i, r);
    }
}

#[cfg(test)]
mod tests {
    use crate::seccomp::model::Action;
    use crate::seccomp::tests::data;
    use crate::seccomp::{bpf, compile, Mode};

    #[test]
    fn with_an_allowlist_inet_sockets_go_to_the_supervisor_and_other_families_are_refused() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../policies/allowlist-example.json");
        let m = crate::policy::Policy::load(std::path::Path::new(path)).unwrap().seccomp;
        let f = compile(&m, Mode::Notify).unwrap();
        let ret = |args: [u64; 6]| bpf::Ret::from_raw(bpf::run(&f.program, &data("socket", args)).unwrap());
        assert_eq!(ret([2, 2, 0, 0, 0, 0]), bpf::Ret::UserNotif);
        assert_eq!(ret([10, 1, 0, 0, 0, 0]), bpf::Ret::UserNotif);
        assert_eq!(ret([1, 1, 0, 0, 0, 0]), bpf::Ret::Allow);
        assert_eq!(ret([16, 3, 0, 0, 0, 0]), bpf::Ret::UserNotif);
        // The model refuses the INET ones too: only the supervisor's TCP
        // check lets one through.
        let v = m.evaluate_named("socket", [2, 1, 0, 0, 0, 0]).unwrap();
        assert!(matches!(v.action, Action::Errno { .. }), "{v:?}");
    }
}
