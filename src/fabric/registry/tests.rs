use super::*;

#[test]
fn remote_keys_are_random_64_bit_and_scoped_to_their_session() {
    let table = Arc::new(Registry::new());
    let mrs: Vec<LocalMr> = (0..64)
        .map(|_| {
            let buf = Arc::new(AlignedBuf::new(4096).unwrap());
            table.clone().register_owned(buf, Access::REMOTE).unwrap()
        })
        .collect();
    let keys: std::collections::HashSet<u64> = mrs.iter().map(|m| m.rkey()).collect();
    assert_eq!(keys.len(), 64);
    assert!(
        keys.iter().any(|k| *k > u64::from(u32::MAX)),
        "64-bit keys use their high half"
    );
    let mr = &mrs[0];
    mr.restrict_to(7);
    let (addr, key) = (mr.addr(), mr.rkey());
    let (seven, eight) = (SessionAccess::full(7), SessionAccess::full(8));
    assert!(table
        .admit_remote(seven, Opcode::Read, key, addr, 4096)
        .is_some());
    assert!(table
        .admit_remote(seven, Opcode::Write, key, addr, 4096)
        .is_some());
    assert!(table
        .admit_remote(eight, Opcode::Read, key, addr, 4096)
        .is_none());
    assert!(table
        .admit_remote(seven, Opcode::Read, key ^ 1, addr, 4096)
        .is_none());
    assert!(table
        .admit_remote(seven, Opcode::Write, key, addr + 1, 4096)
        .is_none());
    // A follower is served as the session, read-only: it reads and never writes.
    let follower = SessionAccess {
        session: 7,
        read_only: true,
    };
    assert!(table
        .admit_remote(follower, Opcode::Read, key, addr, 4096)
        .is_some());
    assert!(table
        .admit_remote(follower, Opcode::Write, key, addr, 4096)
        .is_none());
    // A local key is not a remote key.
    assert!(table
        .admit_remote(seven, Opcode::Read, u64::from(mr.lkey()), addr, 16)
        .is_none());
    drop(mrs);
    assert!(table.is_empty());
}

#[test]
fn a_session_stands_until_its_last_data_path_goes_and_then_serves_nothing() {
    let table = Arc::new(Registry::new());
    let key = crate::fabric::SessionKey {
        id: 7,
        token: [3; crate::fabric::TOKEN_LEN],
        read_only: false,
    };
    // One guard per queue pair the session connected.
    let (a, b) = (table.open_session(key), table.open_session(key));
    let live = table.live_session(&key.token).expect("open");
    drop(a);
    let serving = live.serve().expect("one queue pair's guard is enough");
    drop(serving);
    drop(b);
    assert!(table.live_session(&key.token).is_none());
    assert!(live.serve().is_none(), "a fenced session served a request");
    // Opened again under the same token: a new session, and the old one stays fenced.
    let _c = table.open_session(key);
    assert!(table.live_session(&key.token).unwrap().serve().is_some());
    assert!(live.serve().is_none());
}

#[test]
fn acquire_checks_bounds_access_and_counts_use() {
    let table = Arc::new(Registry::new());
    let buf = Arc::new(AlignedBuf::new(8192).unwrap());
    let addr = buf.addr();
    // SAFETY: the buffer outlives the registration (it is also kept as owner).
    let mr = unsafe {
        table
            .register(buf.as_ptr(), 8192, Access::LOCAL, Some(buf.clone()))
            .unwrap()
    };
    assert!(table
        .acquire(mr.lkey(), addr + 8000, 193, Access::LOCAL_WRITE)
        .is_none());
    assert!(table
        .acquire(mr.lkey(), addr, 16, Access::REMOTE_READ)
        .is_none());
    assert!(table
        .acquire(mr.lkey() ^ 1, addr, 16, Access::LOCAL_WRITE)
        .is_none());
    let hold = table
        .acquire(mr.lkey(), addr + 100, 8092, Access::LOCAL_WRITE)
        .unwrap();
    assert_eq!(mr.in_flight(), 1);
    let mr = match table.deregister_batch(vec![mr]) {
        Err(DeregisterError::Busy(mut v)) => v.pop().unwrap(),
        Ok(()) => panic!("deregistered a region in use"),
    };
    drop(hold);
    assert_eq!(mr.in_flight(), 0);
    table.deregister_batch(vec![mr]).unwrap();
    assert!(table.is_empty());
    assert_eq!(table.counters.snapshot().deregistration_batches, 1);
}

#[test]
fn pinning_is_accounted_and_released() {
    let table = Arc::new(Registry::new());
    let buf = Arc::new(AlignedBuf::new(3 * 4096).unwrap());
    let mr = table
        .clone()
        .register_owned(buf, Access::LOCAL)
        .expect("register");
    assert!(table.pinned.load(Ordering::Relaxed) >= 3 * 4096);
    drop(mr);
    assert_eq!(table.pinned.load(Ordering::Relaxed), 0);
}
