//! `solofs mount --metrics ADDR`: a mount serves its own metrics page
//! (its object-store traffic, the process).

mod common;
use common::*;

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
    drop(m);
    srv.stop();
}
