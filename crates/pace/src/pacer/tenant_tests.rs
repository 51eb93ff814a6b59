//! Tenants whose hosts sit on several reactors: what each reactor's pacer
//! publishes for the others through the shared tenant clock.

use super::tests::{io, two_tenants, K128};
use super::*;

#[test]
fn a_tenants_io_held_by_its_own_flow_claims_no_slots_on_other_reactors() {
    // Tenant 1's host on reactor 0 queues 30 IOs at once; its flow's
    // window (4 IOs to start) holds 26 of them. Its host on reactor 1
    // queues 5 ms later. Reactor 0's old IOs wait for their own flow, not
    // the shared window, so reactor 1 need not yield its slots to them.
    let group = PacerGroup::new(
        &two_tenants(Mode::Auto),
        &[PacedDevice::default()],
        2,
        K128,
        0,
    );
    let (mut a, mut b) = (group.pacer(0, 0), group.pacer(1, 0));
    for i in 0..30 {
        a.enqueue(io(i, 0, 1, K128), 0);
    }
    let mut out = Vec::new();
    a.poll(0, &mut out);
    assert_eq!(out.len(), 4, "the flow's starting window");
    let later = 5_000_000;
    b.enqueue(
        PacedIo {
            flow: 1,
            ..io(100, 0, 1, K128)
        },
        later,
    );
    out.clear();
    a.poll(later, &mut out);
    assert!(out.is_empty(), "reactor 0's flow is still full");
    let clock = &a.sched.tenants.clock;
    assert!(
        clock.holds_oldest(1, 1, 1_000_000),
        "reactor 0 claims nothing"
    );
    out.clear();
    b.poll(later, &mut out);
    assert_eq!(out, vec![100]);
}
