//! TLS (NBD_OPT_STARTTLS) with real clients: libnbd's nbdinfo and qemu-img
//! with X.509 certificates made here by openssl; a client without the right
//! certificate, or without TLS on a `require` listener, is refused.

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::*;

const BUFFERS: &str = "num_shared_buffers = 256\nbuf_cache_size = 8";

/// A CA, a server certificate for 127.0.0.1/localhost and a client
/// certificate, in the file names GnuTLS clients (libnbd, qemu) look for.
fn make_certs(dir: &Path) {
    require("openssl", "openssl");
    let script = r#"set -e
openssl req -x509 -newkey rsa:2048 -nodes -keyout ca-key.pem -out ca-cert.pem -days 2 -subj "/CN=iopace test CA" -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
openssl req -newkey rsa:2048 -nodes -keyout server-key.pem -out server.csr -subj "/CN=localhost"
printf "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n" > server.ext
openssl x509 -req -in server.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -out server-cert.pem -days 2 -extfile server.ext
openssl req -newkey rsa:2048 -nodes -keyout client-key.pem -out client.csr -subj "/CN=client1"
printf "extendedKeyUsage=clientAuth\n" > client.ext
openssl x509 -req -in client.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -out client-cert.pem -days 2 -extfile client.ext
mkdir nocert && cp ca-cert.pem nocert/
mkdir v1 && cp ca-cert.pem client-key.pem v1/
openssl x509 -req -in client.csr -CA ca-cert.pem -CAkey ca-key.pem -CAcreateserial -out v1/client-cert.pem -days 2
"#;
    run(
        Command::new("sh").arg("-c").arg(script).current_dir(dir),
        Duration::from_secs(60),
    );
}

/// The `[tls]` section for the certificates `make_certs` wrote to `certs`.
fn tls_section(certs: &Path) -> String {
    format!(
        "\n[tls]\ncert = \"{0}/server-cert.pem\"\nkey = \"{0}/server-key.pem\"\nca = \"{0}/ca-cert.pem\"\n",
        certs.display()
    )
}

fn tls_server(mode: &str, certs: &Path) -> Server {
    let tls = tls_section(certs);
    Server::start_full(
        &format!("tls = \"{mode}\""),
        &format!("{MALLOC_EXPORTS}{tls}"),
        BUFFERS,
    )
}

fn nbdinfo(uri: &str) -> Output {
    Command::new("timeout")
        .args(["20", "nbdinfo", uri])
        .output()
        .expect("run nbdinfo")
}

#[test]
fn libnbd_and_qemu_connect_with_tls_and_others_are_refused() {
    require("nbdinfo", "libnbd-bin");
    require("qemu-img", "qemu-utils");
    let certs = tempfile::tempdir().expect("tempdir");
    make_certs(certs.path());
    let server = tls_server("require", certs.path());
    let nbds = nbds_uri(server.port, "default", certs.path());
    let out = nbdinfo(&nbds);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("with TLS"), "{text}");

    // No TLS on a `require` listener: every option is refused.
    assert!(!nbdinfo(&server.tcp_uri("default")).status.success());
    // TLS without a client certificate signed by the CA.
    let nocert = nbds_uri(server.port, "default", &certs.path().join("nocert"));
    assert!(!nbdinfo(&nocert).status.success());

    // qemu-img writes 4 MiB through TLS and reads them back.
    let data = certs.path().join("data.raw");
    random_file(&data, 4 << 20, 13);
    let object = format!(
        "tls-creds-x509,id=tls0,endpoint=client,dir={}",
        certs.path().display()
    );
    let target = format!(
        "driver=nbd,host=127.0.0.1,port={},export=default,tls-creds=tls0",
        server.port
    );
    run(
        Command::new("qemu-img")
            .args(["convert", "-n", "--object", &object, "-f", "raw"])
            .arg(&data)
            .args(["--target-image-opts", &target]),
        Duration::from_secs(60),
    );
    let back = certs.path().join("back.raw");
    run(
        Command::new("qemu-img")
            .args([
                "convert",
                "--object",
                &object,
                "--image-opts",
                &target,
                "-O",
                "raw",
            ])
            .arg(&back),
        Duration::from_secs(60),
    );
    let back = std::fs::read(&back).expect("read back");
    assert_eq!(&back[..4 << 20], &std::fs::read(&data).expect("data")[..]);
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("TLS session up"), "{log}");
    // Our suite order wins over GnuTLS's (which puts AES-256 first).
    assert!(log.contains("TLS13_AES_128_GCM_SHA256"), "{log}");
    assert!(log.contains("TLS handshake failed"), "{log}");
    // GnuTLS sends the address it dialled as SNI; rustls ignores it and
    // would say so at warn level for every such client.
    assert!(
        !log.contains("Illegal SNI"),
        "a client that connects by address is no warning: {log}"
    );
}

#[test]
fn require_answers_options_with_tls_reqd_and_on_serves_plaintext() {
    require("nbdinfo", "libnbd-bin");
    let certs = tempfile::tempdir().expect("tempdir");
    make_certs(certs.path());
    let server = tls_server("require", certs.path());
    let mut c = greeted_tcp(server.port);
    c.option(3, &[]); // NBD_OPT_LIST
    let (opt, typ, _) = c.option_reply();
    assert_eq!((opt, typ), (3, 0x8000_0005), "NBD_REP_ERR_TLS_REQD");
    c.option(5, &[]); // NBD_OPT_STARTTLS
    let (opt, typ, _) = c.option_reply();
    assert_eq!((opt, typ), (5, 1), "STARTTLS acknowledged");
    drop(c);
    drop(server);

    let server = tls_server("on", certs.path());
    assert!(nbdinfo(&server.tcp_uri("default")).status.success());
    let nbds = nbds_uri(server.port, "default", certs.path());
    assert!(nbdinfo(&nbds).status.success());
    roundtrip_ok(&server);
}

#[test]
fn access_rules_deny_and_narrow_by_address_and_certificate_name() {
    require("nbdinfo", "libnbd-bin");
    let certs = tempfile::tempdir().expect("tempdir");
    make_certs(certs.path());
    let tls = tls_section(certs.path());
    // `default`: TCP clients from 10/8 only (so not us), and Unix clients;
    // `ro`: open, but read-only for the certificate `client1`.
    let body = MALLOC_EXPORTS
        .replace(
            "name = \"default\"\nbdev = \"m0\"",
            "name = \"default\"\nbdev = \"m0\"\nallow = [\"10.0.0.0/8\", \"unix\"]",
        )
        .replace(
            "name = \"ro\"\nbdev = \"ro0\"\nread_only = true",
            "name = \"ro\"\nbdev = \"ro0\"\nread_only_for = [\"cn:client1\"]",
        );
    let server = Server::start_full("tls = \"on\"", &format!("{body}{tls}"), BUFFERS);
    // Denied over TCP: GO gets NBD_REP_ERR_POLICY; the list leaves it out.
    let mut c = greeted_tcp(server.port);
    let mut go = 7u32.to_be_bytes().to_vec();
    go.extend_from_slice(b"default\0\0");
    c.option(7, &go);
    let (_, typ, _) = c.option_reply();
    assert_eq!(typ, 0x8000_0002, "NBD_REP_ERR_POLICY");
    drop(c);
    let list = Command::new("timeout")
        .args(["20", "nbdinfo", "--list", &server.tcp_uri("")])
        .output()
        .expect("nbdinfo --list");
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(!text.contains("export=\"default\""), "{text}");
    assert!(text.contains("export=\"ro\""), "{text}");
    // Allowed over the Unix socket.
    roundtrip_ok(&server);
    // `ro` is writable in plaintext, read-only for the certificate client1.
    let plain = nbdinfo(&server.tcp_uri("ro"));
    assert!(String::from_utf8_lossy(&plain.stdout).contains("is_read_only: false"));
    let nbds = nbds_uri(server.port, "ro", certs.path());
    let out = nbdinfo(&nbds);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("is_read_only: true"), "{text}");
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("denied=[\"default\"]"), "{log}");
    assert!(log.contains("cert_name=\"client1\""), "{log}");
}

/// SELECTIVETLS (`tls = "on"`): an export only a certificate opens is
/// TLS-only to a plaintext client, and the spec has INFO and GO for it
/// answer NBD_REP_ERR_TLS_REQD ("MUST"), not POLICY, so the client knows
/// STARTTLS may open it; with the certificate, it opens.
#[test]
fn an_export_only_a_certificate_opens_asks_plaintext_clients_for_tls() {
    require("nbdinfo", "libnbd-bin");
    let certs = tempfile::tempdir().expect("tempdir");
    make_certs(certs.path());
    let tls = tls_section(certs.path());
    let body = MALLOC_EXPORTS.replace(
        "name = \"default\"\nbdev = \"m0\"",
        "name = \"default\"\nbdev = \"m0\"\nallow = [\"cn:client1\"]",
    );
    let server = Server::start_full("tls = \"on\"", &format!("{body}{tls}"), BUFFERS);
    let mut c = greeted_tcp(server.port);
    for opt in [6, 7] {
        // NBD_OPT_INFO, NBD_OPT_GO
        let mut go = 7u32.to_be_bytes().to_vec();
        go.extend_from_slice(b"default\0\0");
        c.option(opt, &go);
        let (_, typ, _) = c.option_reply();
        assert_eq!(typ, 0x8000_0005, "option {opt}: NBD_REP_ERR_TLS_REQD");
    }
    // The plaintext session goes on: another export opens.
    assert_eq!(c.go("ro"), 16 << 20);
    let out = nbdinfo(&nbds_uri(server.port, "default", certs.path()));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Sends `dir`'s client certificate as it is (rustls's client would check
/// it), whatever it is.
#[derive(Debug)]
struct SendsCert(std::sync::Arc<rustls::sign::CertifiedKey>);

impl rustls::client::ResolvesClientCert for SendsCert {
    fn resolve(
        &self,
        _: &[&[u8]],
        _: &[rustls::SignatureScheme],
    ) -> Option<std::sync::Arc<rustls::sign::CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// STARTTLS by hand, then TLS with `dir`'s client certificate: the error
/// the client's session ends with.
fn tls_error_of_client(port: u16, dir: &Path) -> rustls::Error {
    use std::sync::Arc;
    let pem = |name: &str| std::fs::read(dir.join(name)).expect("read pem");
    let certs = |name: &str| -> Vec<_> {
        rustls_pemfile::certs(&mut pem(name).as_slice())
            .collect::<Result<_, _>>()
            .expect("certs")
    };
    let mut roots = rustls::RootCertStore::empty();
    for c in certs("ca-cert.pem") {
        roots.add(c).expect("root");
    }
    let key = rustls_pemfile::private_key(&mut pem("client-key.pem").as_slice())
        .expect("key pem")
        .expect("a key");
    let provider = rustls::crypto::ring::default_provider();
    let signer = provider.key_provider.load_private_key(key).expect("signer");
    let certified = rustls::sign::CertifiedKey::new(certs("client-cert.pem"), signer);
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_client_cert_resolver(Arc::new(SendsCert(Arc::new(certified))));
    let mut c = greeted_tcp(port);
    c.option(5, &[]); // NBD_OPT_STARTTLS
    assert_eq!(c.option_reply().1, 1, "STARTTLS acknowledged");
    let name = rustls::pki_types::ServerName::try_from("localhost").expect("name");
    let mut tls = rustls::ClientConnection::new(Arc::new(config), name).expect("client");
    let mut s = c.s;
    let tls_error = |e: std::io::Error| -> rustls::Error {
        let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
        inner
            .cloned()
            .unwrap_or_else(|| panic!("not a TLS error: {e}"))
    };
    while tls.is_handshaking() {
        if let Err(e) = tls.complete_io(&mut s) {
            return tls_error(e);
        }
    }
    // TLS 1.3: the server's verdict comes after the client's Finished.
    loop {
        match tls.read_tls(&mut s) {
            Ok(0) => break,
            Ok(_) => {
                if let Err(e) = tls.process_new_packets() {
                    return e;
                }
            }
            Err(e) => return tls_error(e),
        }
    }
    panic!("the server closed without an alert");
}

/// The NBD-over-TLS URI of `export` on the server at `port`, with client
/// certificates from `certs`.
fn nbds_uri(port: u16, export: &str, certs: &Path) -> String {
    format!(
        "nbds://127.0.0.1:{port}/{export}?tls-certificates={}",
        certs.display()
    )
}

/// A v1 client certificate (what `openssl x509 -req` makes without
/// extensions) is refused with its reason in the log, and the client gets
/// the alert that names the fault (certificate_unknown).
#[test]
fn a_client_certificate_that_fails_is_logged_and_alerted() {
    require("nbdinfo", "libnbd-bin");
    let certs = tempfile::tempdir().expect("tempdir");
    make_certs(certs.path());
    let server = tls_server("require", certs.path());
    let v1 = nbds_uri(server.port, "default", &certs.path().join("v1"));
    let out = nbdinfo(&v1);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    // libnbd names no alert; a client that reads it sees which.
    assert!(stderr.contains("fatal alert"), "{stderr}");
    assert_eq!(
        tls_error_of_client(server.port, &certs.path().join("v1")),
        rustls::Error::AlertReceived(rustls::AlertDescription::CertificateUnknown)
    );
    // The server goes on serving others.
    let good = nbds_uri(server.port, "default", certs.path());
    assert!(nbdinfo(&good).status.success());
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("TLS handshake failed"), "{log}");
    assert!(log.contains("UnsupportedCertVersion"), "{log}");
    assert!(log.contains("CertificateUnknown"), "{log}");
}

/// TLS clients killed in the middle of writes and reads: every buffer comes
/// back, and the server goes on serving.
#[test]
fn tls_clients_killed_mid_io_return_every_buffer() {
    require("nbdcopy", "libnbd-bin");
    let certs = tempfile::tempdir().expect("tempdir");
    make_certs(certs.path());
    let server = tls_server("require", certs.path());
    let nbds = nbds_uri(server.port, "default", certs.path());
    let data = certs.path().join("data.raw");
    random_file(&data, 48 << 20, 7);
    for (from, to) in [
        (data.display().to_string(), nbds.clone()),
        (nbds.clone(), "null:".to_string()),
    ] {
        for kill_after in ["0.2", "0.5"] {
            let _ = Command::new("timeout")
                .args(["-s", "KILL", kill_after, "nbdcopy", "-C", "2"])
                .args(["--request-size=262144", &from, &to])
                .status()
                .expect("nbdcopy");
        }
    }
    assert!(nbdinfo(&nbds).status.success(), "still serving");
    let (status, text) = server.stop();
    assert!(status.success(), "exit {status}:\n{text}");
    let (free, total) = pool_at_exit(&text);
    assert!(
        free.is_some() && free == total,
        "every buffer back at exit:\n{text}"
    );
}
