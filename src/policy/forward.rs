//! Host services when the network is filtered: `--forward-port` and `forward_ports` bring
//! one host loopback port into an `allowlist` or `none` sandbox, at the same address
//! inside, and nothing else of the host's loopback.
//!
//! Pure: parsing, merging the layers, and the one list of loopback forwards that the plan,
//! `--dry-run` and the proxy all compute the same way. A forwarded port travels the
//! allowlist's loopback-forward path (`network::LoopbackForward`): the sandbox's first step
//! listens on the address inside and hands the socket to claudebox's proxy process on the
//! host, which connects each connection to the fixed host address decided here. In `none`
//! mode that process serves the forwards alone: no HTTP proxy, no 3128 inside.
//!
//! Decisions: `PORT` alone is `localhost:PORT` (inside on 127.0.0.1 and ::1, on the host
//! 127.0.0.1 then ::1); `127.0.0.1:PORT` (any of 127.0.0.0/8) and `[::1]:PORT` name one
//! address on both sides. The port inside is the host's port (no remapping: a client
//! configured on the host, `DATABASE_URL=...localhost:5432`, works unchanged inside). In
//! `open` mode the sandbox already shares the host's loopback: a layer that names `open`
//! and forwards a port contradicts itself and is refused; a forward from another layer is
//! a no-op, noted by `--dry-run`.

use anyhow::{anyhow, bail, Result};

use crate::policy::error::Fixable;
use crate::policy::network::{
    self, add_forward, entry_forwards, Allowlist, ForwardKind, HostEntry, HostMatch, HostPattern,
    LoopbackForward, ModeName, NetworkChoice, NetworkMode, ProxySpec, MAX_FORWARDS,
};

/// The flag, as error messages and sources name it.
pub const FLAG: &str = "--forward-port";

/// Parses `PORT`, `localhost:PORT`, `127.0.0.1:PORT` (127.0.0.0/8) or `[::1]:PORT`.
pub fn parse(s: &str) -> Result<HostPattern> {
    let s = s.trim();
    if !s.contains(':') {
        let port = network::parse_port(s)?;
        return Ok(HostPattern {
            host: HostMatch::Exact("localhost".into()),
            port: Some(port),
        });
    }
    let p = HostPattern::parse(s)?;
    if p.port.is_none() {
        bail!("name the port, as in 5432 or 127.0.0.1:5432");
    }
    if !network::is_loopback_host_port(&p) {
        bail!(Fixable::new(
            format!("{p} is not the host's loopback"),
            "only a loopback port (5432, localhost:5432, 127.0.0.1:5432, [::1]:5432) can be \
             forwarded; other hosts go through --allow-host in allowlist mode"
        ));
    }
    Ok(p)
}

/// The forwarded ports of every layer, in order, each with where it came from: a layer
/// that also names `open` is refused, a port given twice in one layer is refused, a
/// repeat from a later layer is dropped.
pub fn resolve(layers: &[NetworkChoice]) -> Result<Vec<HostEntry>> {
    let mut out: Vec<HostEntry> = Vec::new();
    for l in layers {
        if let (Some(ModeName::Open), Some((raw, _))) = (l.mode, l.forward_ports.first()) {
            bail!(Fixable::new(
                format!(
                    "{}: forwarding host port {raw} makes no sense with network mode open",
                    l.source
                ),
                "in open mode the sandbox already shares the host's loopback; drop one of them"
            ));
        }
        let mut layer: Vec<(LoopbackForward, &str)> = Vec::new();
        for (raw, source) in &l.forward_ports {
            let named = network::named(source, "forward_ports", FLAG, raw);
            let pattern = parse(raw).map_err(|e| anyhow!("{named}: {e}"))?;
            let entry = HostEntry {
                pattern,
                source: source.clone(),
            };
            for f in entry_forwards(&entry, ForwardKind::HostPort) {
                if let Some((_, earlier)) = layer.iter().find(|(o, _)| o.listen == f.listen) {
                    bail!(
                        "{named}: {} is already forwarded by {earlier} (give each port once)",
                        f.listen
                    );
                }
                layer.push((f, raw));
            }
            if out.iter().all(|e| e.pattern != entry.pattern) {
                out.push(entry);
            }
        }
    }
    Ok(out)
}

/// Here rather than beside `ProxySpec` (in `network`), so that `network`, below, does not
/// import `forward`, which is made of its types.
impl ProxySpec {
    /// Every loopback forward: the allowlist's, then the forwarded host ports.
    pub fn forwards(&self) -> Result<Vec<LoopbackForward>> {
        all(
            self.http_proxy.then_some(&self.allowlist),
            &self.forward_ports,
        )
    }
}

/// Every loopback forward of a launch: the allowlist's (when the HTTP proxy runs, in
/// allowlist mode), then the forwarded host ports; the first one wins an address. Refuses
/// the proxy's own port when the proxy listens, and more than [`MAX_FORWARDS`].
pub fn all(allowlist: Option<&Allowlist>, ports: &[HostEntry]) -> Result<Vec<LoopbackForward>> {
    let mut out = match allowlist {
        Some(list) => network::loopback_forwards(list)?,
        None => Vec::new(),
    };
    for e in ports {
        for f in entry_forwards(e, ForwardKind::HostPort) {
            add_forward(&mut out, f, allowlist.is_some())?;
        }
    }
    if out.len() > MAX_FORWARDS {
        bail!(Fixable::new(
            format!(
                "{} loopback addresses to forward; claudebox hands at most {MAX_FORWARDS} to \
                 its proxy",
                out.len()
            ),
            "forward fewer ports (a bare PORT takes two addresses: 127.0.0.1 and ::1)"
        ));
    }
    Ok(out)
}

/// The forwards in force for `mode`: none in open mode (the ports are the host's anyway).
pub fn in_mode(mode: &NetworkMode, ports: &[HostEntry]) -> Result<Vec<LoopbackForward>> {
    match mode {
        NetworkMode::Open => Ok(Vec::new()),
        NetworkMode::None => all(None, ports),
        NetworkMode::Allowlist(list) => all(Some(list), ports),
    }
}

/// The network line of `--dry-run` and `--check`: the mode, then the forwarded ports.
pub fn describe(mode: &NetworkMode, ports: &[HostEntry]) -> String {
    let mut d = network::describe(mode);
    if ports.is_empty() {
        return d;
    }
    let list = ports
        .iter()
        .map(|e| e.pattern.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let n = ports.len();
    let s = if n == 1 { "" } else { "s" };
    match mode {
        NetworkMode::Open => d.push_str(&format!(
            "; {n} forwarded host port{s} ignored ({list}): the host's loopback is shared \
             anyway"
        )),
        NetworkMode::None => {
            d = format!(
                "none: own network namespace with loopback only; no way out but {n} forwarded \
             host port{s}: {list}"
            )
        }
        NetworkMode::Allowlist(_) => {
            d.push_str(&format!("; and {n} forwarded host port{s}: {list}"))
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shown(s: &str) -> String {
        match parse(s) {
            Ok(p) => p.to_string(),
            Err(e) => format!("error: {e}"),
        }
    }

    #[test]
    fn forms() {
        assert_eq!(shown("5432"), "localhost:5432");
        assert_eq!(shown(" 5432 "), "localhost:5432");
        assert_eq!(shown("localhost:5432"), "localhost:5432");
        assert_eq!(shown("LOCALHOST:5432"), "localhost:5432");
        assert_eq!(shown("127.0.0.1:80"), "127.0.0.1:80");
        assert_eq!(shown("127.1.2.3:80"), "127.1.2.3:80");
        assert_eq!(shown("[::1]:8080"), "[::1]:8080");
        for bad in [
            "0",
            "65536",
            "70000",
            "-1",
            "+1",
            "abc",
            "",
            "1.5",
            "127.0.0.1",
            "127.0.0.1:0",
            "localhost:",
            "[::1]",
            "example.com:80",
            "10.0.0.1:80",
            "0.0.0.0:80",
            "[::]:80",
            "*.example.com:80",
            "http://localhost:80",
            "169.254.169.254:80",
            "[::ffff:127.0.0.1]:80",
        ] {
            assert!(shown(bad).starts_with("error: "), "{bad:?} accepted");
        }
        assert!(
            shown("abc").contains("not a port number"),
            "{}",
            shown("abc")
        );
        assert!(shown("10.0.0.1:80").contains("--allow-host"));
    }

    fn layer(mode: Option<ModeName>, ports: &[&str], source: &str) -> NetworkChoice {
        NetworkChoice {
            mode,
            forward_ports: ports
                .iter()
                .map(|p| (p.to_string(), source.to_string()))
                .collect(),
            source: source.to_string(),
            ..NetworkChoice::default()
        }
    }

    #[test]
    fn layers_accumulate_with_their_sources() {
        let ports = resolve(&[
            layer(None, &["5432"], "config a:1"),
            layer(
                Some(ModeName::None),
                &["8080", "localhost:5432"],
                "--forward-port",
            ),
        ])
        .unwrap();
        let v: Vec<String> = ports
            .iter()
            .map(|e| format!("{} {}", e.pattern, e.source))
            .collect();
        assert_eq!(
            v,
            ["localhost:5432 config a:1", "localhost:8080 --forward-port"]
        );
    }

    #[test]
    fn refusals() {
        let e = resolve(&[layer(Some(ModeName::Open), &["5432"], "--network")]).unwrap_err();
        assert!(e.to_string().contains("mode open"), "{e}");
        // Open from another layer: accepted (a no-op).
        assert!(resolve(&[
            layer(None, &["5432"], "config"),
            layer(Some(ModeName::Open), &[], "--network")
        ])
        .is_ok());
        let e = resolve(&[layer(None, &["5432", "5432"], "--forward-port")]).unwrap_err();
        assert!(e.to_string().contains("already forwarded"), "{e}");
        let e = resolve(&[layer(None, &["5432", "127.0.0.1:5432"], "x")]).unwrap_err();
        assert!(e.to_string().contains("already forwarded"), "{e}");
        let e = resolve(&[layer(None, &["0"], "--forward-port")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "--forward-port 0: \"0\" is not a port number (1-65535)"
        );
        let e = resolve(&[layer(None, &["x"], "config /c:3")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "config /c:3: forward_ports x: \"x\" is not a port number (1-65535)"
        );
        // Different addresses of one port are fine.
        assert!(resolve(&[layer(None, &["127.0.0.1:5432", "[::1]:5432"], "x")]).is_ok());
    }

    fn entries(ports: &[&str]) -> Vec<HostEntry> {
        ports
            .iter()
            .map(|p| HostEntry {
                pattern: parse(p).unwrap(),
                source: "t".into(),
            })
            .collect()
    }

    #[test]
    fn the_proxy_port_is_refused_only_where_the_proxy_listens() {
        let ports = entries(&["3128"]);
        let e = all(Some(&Allowlist::default_list()), &ports).unwrap_err();
        assert!(e.to_string().contains("3128"), "{e}");
        let f = all(None, &ports).unwrap();
        assert_eq!(f.len(), 2);
        assert_eq!(f[0].listen.to_string(), "127.0.0.1:3128");
        assert_eq!(
            f[0].targets()
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>(),
            ["127.0.0.1:3128", "[::1]:3128"]
        );
        assert!(f[1].optional);
    }

    #[test]
    fn allowlist_forwards_come_first_and_win_an_address() {
        let mut list = Allowlist::default_list();
        list.push(
            HostPattern::parse("127.0.0.1:5432").unwrap(),
            "--allow-host",
        );
        let f = all(Some(&list), &entries(&["5432", "[::1]:7"])).unwrap();
        let v: Vec<String> = f
            .iter()
            .map(|f| format!("{} {:?} {}", f.listen, f.kind, f.target_shown()))
            .collect();
        assert_eq!(
            v,
            [
                "127.0.0.1:5432 AllowedHost 127.0.0.1:5432",
                "[::1]:5432 HostPort localhost:5432",
                "[::1]:7 HostPort [::1]:7",
            ]
        );
        assert_eq!(f[2].targets().len(), 1);
        // In open mode nothing is forwarded.
        assert!(in_mode(&NetworkMode::Open, &entries(&["5432"]))
            .unwrap()
            .is_empty());
        let many: Vec<String> = (1..=17).map(|p| p.to_string()).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let e = all(None, &entries(&many)).unwrap_err();
        assert!(e.to_string().contains("at most 32"), "{e}");
    }

    #[test]
    fn describe_names_the_forwards() {
        let ports = entries(&["5432"]);
        let d = describe(&NetworkMode::None, &ports);
        assert!(
            d.starts_with("none:") && d.ends_with("1 forwarded host port: localhost:5432"),
            "{d}"
        );
        let d = describe(&NetworkMode::Open, &ports);
        assert!(d.contains("ignored"), "{d}");
        let d = describe(&NetworkMode::Allowlist(Allowlist::default_list()), &ports);
        assert!(
            d.ends_with("and 1 forwarded host port: localhost:5432"),
            "{d}"
        );
        assert_eq!(
            describe(&NetworkMode::None, &[]),
            network::describe(&NetworkMode::None)
        );
    }
}
