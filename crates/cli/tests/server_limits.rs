//! Server limits: connections beyond `--max-connections` are refused with a
//! clear error, and idle connections are closed after `--idle-timeout-secs`.

mod common;

use common::{Scratch, ServerProc};
use solofs_client::{Client, ClientError};
use std::io::Read;
use std::time::{Duration, Instant};

#[test]
fn connection_limit_and_idle_timeout() {
    let s = Scratch::new("limits");
    let srv = ServerProc::start_with(
        &s.path,
        "127.0.0.1:0",
        &["--max-connections", "2", "--idle-timeout-secs", "1"],
    );
    let secret = s.secret();
    let a = Client::connect(&srv.addr, &secret).unwrap();
    let b = Client::connect(&srv.addr, &secret).unwrap();
    match Client::connect(&srv.addr, &secret) {
        Err(ClientError::Refused(m)) => assert!(m.contains("too many connections"), "{m}"),
        Err(e) => panic!("third connection: {e}"),
        Ok(_) => panic!("a third connection was accepted over the limit of 2"),
    }
    a.noop().unwrap();
    b.noop().unwrap();
    drop((a, b));
    // An idle raw connection is closed by the server after about a second.
    std::thread::sleep(Duration::from_millis(300));
    let mut raw = std::net::TcpStream::connect(&srv.addr).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 16];
    let n = raw.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the server sent data to an idle connection");
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "closed after {waited:?}"
    );
    // Freed slots accept new clients again.
    Client::connect(&srv.addr, &secret).unwrap().noop().unwrap();
    assert!(srv.stop().success());
}

#[test]
fn settings_from_a_config_file_and_the_environment() {
    use std::io::BufRead;
    let s = Scratch::new("config");
    let cfg = s.path.join("solofs.toml");
    std::fs::write(
        &cfg,
        format!("# all settings for this server\ndata = \"{}\"\nlisten = \"127.0.0.1:0\"\nmax_connections = 1\n", s.path.display()),
    )
    .unwrap();
    let mut child = std::process::Command::new(common::BIN)
        .args(["serve", "--config"])
        .arg(&cfg)
        .env("SOLOFS_WORKERS", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = lines
        .by_ref()
        .map_while(|l| l.ok())
        .find_map(|l| l.strip_prefix("listening on ").map(String::from))
        .expect("the server reported no address");
    let secret = s.secret();
    let first = Client::connect(&addr, &secret).unwrap();
    first.noop().unwrap();
    assert!(
        matches!(
            Client::connect(&addr, &secret),
            Err(ClientError::Refused(_))
        ),
        "max_connections from the file"
    );
    drop(first);
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    assert!(child.wait().unwrap().success());
    // An unknown key is refused with its name.
    std::fs::write(&cfg, "lisen = \"x\"\n").unwrap();
    let out = std::process::Command::new(common::BIN)
        .args(["serve", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("lisen"));
}
