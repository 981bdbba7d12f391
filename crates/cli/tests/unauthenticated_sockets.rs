//! Sockets that connect and never authenticate cannot lock clients out:
//! they are closed after the authentication deadline, they never take the
//! slots of authenticated connections (`max_connections` counts only
//! those), and past `max_unauthenticated` the oldest of them makes room
//! for a new handshake.

mod common;

use common::{Scratch, ServerProc};
use solofs_client::{Client, ClientError};
use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

#[test]
fn silent_sockets_never_lock_clients_out() {
    let s = Scratch::new("unauth");
    let srv = ServerProc::start_with(
        &s.path,
        "127.0.0.1:0",
        &[
            "--max-connections",
            "8",
            "--max-unauthenticated",
            "32",
            "--auth-timeout-secs",
            "1.5",
        ],
    );
    let secret = s.secret();
    // Far more silent sockets than either limit.
    let silent: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(&srv.addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    // A client still gets in at once, and so do clients up to the limit.
    let t = Instant::now();
    let mut clients = Vec::new();
    for i in 0..8 {
        let c = Client::connect(&srv.addr, &secret)
            .unwrap_or_else(|e| panic!("client {i} among 300 silent sockets: {e}"));
        c.noop().unwrap();
        clients.push(c);
    }
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    // The ninth authenticated connection is over the limit, and is told so.
    match Client::connect(&srv.addr, &secret) {
        Err(ClientError::Refused(m)) => assert!(m.contains("too many connections"), "{m}"),
        Err(e) => panic!("ninth client: {e}"),
        Ok(_) => panic!("ninth client accepted over max_connections 8"),
    }
    // Closing one authenticated client frees its slot.
    drop(clients.pop());
    let again = Instant::now();
    loop {
        match Client::connect(&srv.addr, &secret) {
            Ok(c) => {
                clients.push(c);
                break;
            }
            Err(e) if again.elapsed() < Duration::from_secs(3) => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("slot not freed after a client left: {e}"),
        }
    }
    // Every silent socket is closed by the server within the deadline
    // (1.5 s) plus a sweep; reads see end-of-file or a reset.
    let deadline = Instant::now() + Duration::from_secs(5);
    for (i, mut s) in silent.into_iter().enumerate() {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "silent socket {i} still open after 5 s");
        s.set_read_timeout(Some(left)).unwrap();
        let mut b = [0u8; 16];
        match s.read(&mut b) {
            Ok(0) => {}
            Ok(_) => {} // an ERROR frame before the close is fine
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("silent socket {i} not closed: {e}"),
        }
    }
    // The authenticated clients are still served.
    for c in &clients {
        c.noop().unwrap();
    }
}

/// Server RSS in KiB.
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Issue 44 item 5: 256 connections that announce 16 MiB frames before
/// any HELLO and send body bytes as fast as the server takes them made the
/// server hold up to 16 MiB each (60 of them: 28 MiB → 1 008 MiB).
#[test]
fn oversized_frames_before_authentication_hold_no_memory() {
    use std::io::Write;
    let s = Scratch::new("unauth-big");
    let srv = ServerProc::start_with(&s.path, "127.0.0.1:0", &[]);
    let secret = s.secret();
    let warm = Client::connect(&srv.addr, &secret).unwrap();
    warm.noop().unwrap();
    drop(warm);
    std::thread::sleep(Duration::from_millis(200));
    let before = rss_kib(srv.child.id());
    let mut socks: Vec<TcpStream> = (0..256)
        .map(|_| TcpStream::connect(&srv.addr).unwrap())
        .collect();
    let body = vec![0x5au8; 64 << 10];
    for s in &mut socks {
        s.set_nonblocking(true).unwrap();
        let _ = s.write(&(solofs_proto::MAX_FRAME).to_le_bytes());
    }
    // Push body bytes for a while, round robin, as far as each socket
    // takes them (a closed socket just errors).
    let until = Instant::now() + Duration::from_secs(3);
    let mut sent = 0u64;
    let mut peak = before;
    while Instant::now() < until {
        for s in &mut socks {
            if let Ok(n) = s.write(&body) {
                sent += n as u64;
            }
        }
        peak = peak.max(rss_kib(srv.child.id()));
    }
    let grew = peak.saturating_sub(before);
    assert!(
        grew < 64 << 10,
        "server RSS grew by {grew} KiB ({before} → {peak}) for {sent} bytes sent"
    );
    // Every such socket has been told and closed, and a real client is
    // served at once.
    for (i, mut s) in socks.into_iter().enumerate() {
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 4096];
        loop {
            match s.read(&mut b) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("socket {i} with an oversized frame not closed: {e}"),
            }
        }
    }
    let c = Client::connect(&srv.addr, &secret).unwrap();
    c.noop().unwrap();
}
