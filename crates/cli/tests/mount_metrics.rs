//! `solofs mount --metrics ADDR`: a mount serves its own metrics page
//! (the kernel's requests by type, what the mount answered itself and
//! asked the server, its object-store traffic and latency, the process).

mod common;
use common::*;
use std::time::Duration;

#[test]
fn a_mount_serves_its_store_traffic_and_process_metrics() {
    if !is_root() {
        eprintln!("skipped: mounting needs root");
        return;
    }
    let s = Scratch::new("mount-metrics");
    let srv = ServerProc::start(&s.path);
    let addr = free_loopback_addr();
    let mnt = s.path.with_extension("mnt");
    let m = MountProc::start(
        &srv.addr,
        &s.path.join("secret"),
        &mnt,
        &["--metrics", &addr],
    );
    let data: Vec<u8> = (0..5_000_000u32).map(|i| i as u8).collect();
    std::fs::write(mnt.join("big"), &data).unwrap();
    let page = metrics_page(&addr);
    let put = metric_sum(&page, "solofs_store_requests_total{op=\"put\"}");
    let bytes = metric_sum(&page, "solofs_store_bytes_total{op=\"put\"}");
    assert!(put >= 2, "{page}");
    assert!(bytes >= 5_000_000, "{page}");
    assert!(
        metric_sum(&page, "process_resident_memory_bytes") > 0,
        "{page}"
    );
    assert!(page.contains("solofs_build_info{"), "{page}");
    // Every put is in the latency histogram.
    let seconds = "solofs_store_request_seconds";
    assert_eq!(
        metric_sum(&page, &format!("{seconds}_count{{op=\"put\"}}")),
        put,
        "{page}"
    );
    assert_eq!(
        metric_sum(
            &page,
            &format!("{seconds}_bucket{{op=\"put\",le=\"+Inf\"}}")
        ),
        put,
        "{page}"
    );

    // Files made, looked at and removed through the mount: the kernel's
    // requests by type, the server's requests, and unlinks answered early
    // (all answered by the end).
    let before = metrics_page(&addr);
    let dir = mnt.join("d");
    std::fs::create_dir(&dir).unwrap();
    for i in 0..50 {
        std::fs::write(dir.join(format!("f{i}")), b"x").unwrap();
    }
    for i in 0..50 {
        std::fs::metadata(dir.join(format!("f{i}"))).unwrap();
    }
    for i in 0..50 {
        std::fs::remove_file(dir.join(format!("f{i}"))).unwrap();
    }
    std::fs::remove_dir(&dir).unwrap();
    let page = metrics_page(&addr);
    let grew = |name: &str| metric_sum(&page, name) - metric_sum(&before, name);
    let fuse = |op: &str| grew(&format!("solofs_fuse_requests_total{{op=\"{op}\"}}"));
    assert_eq!(fuse("create"), 50, "{page}");
    assert_eq!(fuse("unlink"), 50, "{page}");
    assert_eq!(fuse("mkdir"), 1, "{page}");
    assert!(fuse("write") >= 50, "{page}");
    let sent = grew("solofs_mount_server_requests_total");
    assert!(
        (100..1000).contains(&sent),
        "{sent} server requests: {page}"
    );
    assert_eq!(grew("solofs_mount_early_unlinks_total"), 50, "{page}");
    within("early unlinks answered", Duration::from_secs(5), || {
        metric_sum(&metrics_page(&addr), "solofs_mount_early_unlinks_pending") == 0
    });
    for series in [
        "solofs_mount_attr_answers_total{from=\"cache\"}",
        "solofs_mount_lookup_answers_total{from=\"server\"}",
        "solofs_mount_read_cache_total{result=\"hit\"}",
        "solofs_mount_opens_answered_here_total",
    ] {
        assert!(page.contains(series), "{series}: {page}");
    }
    drop(m);
    srv.stop();
}
