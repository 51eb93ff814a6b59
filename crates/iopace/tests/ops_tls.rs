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
"#;
    run(
        Command::new("sh").arg("-c").arg(script).current_dir(dir),
        Duration::from_secs(60),
    );
}

fn tls_server(mode: &str, certs: &Path) -> Server {
    let tls = format!(
        "\n[tls]\ncert = \"{0}/server-cert.pem\"\nkey = \"{0}/server-key.pem\"\nca = \"{0}/ca-cert.pem\"\n",
        certs.display()
    );
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
    let nbds = format!(
        "nbds://127.0.0.1:{}/default?tls-certificates={}",
        server.port,
        certs.path().display()
    );
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
    let nocert = format!(
        "nbds://127.0.0.1:{}/default?tls-certificates={}/nocert",
        server.port,
        certs.path().display()
    );
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
    let s = std::net::TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut c = RawClient { s };
    c.greet();
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
    let nbds = format!(
        "nbds://127.0.0.1:{}/default?tls-certificates={}",
        server.port,
        certs.path().display()
    );
    assert!(nbdinfo(&nbds).status.success());
    roundtrip_ok(&server);
}

#[test]
fn access_rules_deny_and_narrow_by_address_and_certificate_name() {
    require("nbdinfo", "libnbd-bin");
    let certs = tempfile::tempdir().expect("tempdir");
    make_certs(certs.path());
    let tls = format!(
        "\n[tls]\ncert = \"{0}/server-cert.pem\"\nkey = \"{0}/server-key.pem\"\nca = \"{0}/ca-cert.pem\"\n",
        certs.path().display()
    );
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
    let s = std::net::TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut c = RawClient { s };
    c.greet();
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
    let nbds = format!(
        "nbds://127.0.0.1:{}/ro?tls-certificates={}",
        server.port,
        certs.path().display()
    );
    let out = nbdinfo(&nbds);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("is_read_only: true"), "{text}");
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("denied=[\"default\"]"), "{log}");
    assert!(log.contains("cert_name=\"client1\""), "{log}");
}

#[test]
fn tls_connections_beyond_max_sessions_are_closed_and_logged() {
    let certs = tempfile::tempdir().expect("tempdir");
    make_certs(certs.path());
    let tls = format!(
        "\n[tls]\ncert = \"{0}/server-cert.pem\"\nkey = \"{0}/server-key.pem\"\nmax_sessions = 1\n",
        certs.path().display()
    );
    let server = Server::start_full(
        "tls = \"require\"",
        &format!("{MALLOC_EXPORTS}{tls}"),
        BUFFERS,
    );
    let connect = || {
        let s = std::net::TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s
    };
    // A connection that got the greeting, once a session is free (the
    // readiness probe's may still hold it for a moment).
    let greeted = || {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let mut s = connect();
            let mut greeting = [0u8; 8];
            if std::io::Read::read_exact(&mut s, &mut greeting).is_ok() {
                assert_eq!(&greeting, b"NBDMAGIC");
                return s;
            }
            assert!(std::time::Instant::now() < deadline, "no session freed");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // The first connection holds the only session while it negotiates.
    let first = greeted();
    let mut second = connect();
    let mut byte = [0u8; 1];
    let n = std::io::Read::read(&mut second, &mut byte).expect("closed, not reset");
    assert_eq!(n, 0, "beyond max_sessions the connection is closed at once");
    // Once the first goes, its place is free again.
    drop(first);
    drop(greeted());
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    assert!(log.contains("refused a TLS connection"), "{log}");
    assert!(log.contains("max_sessions"), "{log}");
}
