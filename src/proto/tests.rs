use super::wire::tag;
use super::*;
use proptest::prelude::*;

#[test]
fn every_message_round_trips() {
    for msg in sample_messages() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &msg).unwrap();
        let back = read_frame(&mut buf.as_slice()).unwrap();
        assert_eq!(back, msg);
    }
}

#[test]
fn every_refusal_code_round_trips() {
    for code in [
        RefusalCode::NoSpace,
        RefusalCode::BadLength,
        RefusalCode::RegistrationFailed,
        RefusalCode::NotFound,
        RefusalCode::ShuttingDown,
        RefusalCode::Held,
        RefusalCode::Fenced,
        RefusalCode::NoVolume,
        RefusalCode::VolumeExists,
    ] {
        let msg = Message::Refused {
            tag: 1,
            code,
            message: String::new(),
        };
        assert_eq!(Message::decode(&msg.encode()).unwrap(), msg);
    }
}

#[test]
fn truncations_of_every_message_are_errors() {
    for msg in sample_messages() {
        let body = msg.encode();
        for cut in 0..body.len() {
            assert!(
                Message::decode(&body[..cut]).is_err(),
                "{msg:?} cut at {cut} decoded"
            );
        }
    }
}

#[test]
fn oversized_frame_is_rejected_before_reading_its_body() {
    let mut frame = ((MAX_FRAME_LEN + 1) as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(&[0; 16]);
    match read_frame(&mut frame.as_slice()) {
        Err(FrameError::Proto(ProtoError::Oversized(_))) => {}
        other => panic!("expected oversized, got {other:?}"),
    }
}

#[test]
fn trailing_bytes_and_bad_fields_are_rejected() {
    let mut body = Message::Stat { tag: 1 }.encode();
    body.push(0);
    assert_eq!(Message::decode(&body), Err(ProtoError::TrailingBytes(1)));
    let mut alloc0 = vec![tag::ALLOC];
    alloc0.extend_from_slice(&1u64.to_le_bytes());
    alloc0.extend_from_slice(&0u64.to_le_bytes());
    assert!(matches!(
        Message::decode(&alloc0),
        Err(ProtoError::BadField(..))
    ));
    let mut hello = Message::Hello {
        version: 1,
        client_name: "x".into(),
        nonce: [0; 32],
        observer: true,
    }
    .encode();
    hello[1] ^= 0xff;
    assert!(matches!(
        Message::decode(&hello),
        Err(ProtoError::BadMagic(_))
    ));
    assert_eq!(Message::decode(&[200]), Err(ProtoError::UnknownType(200)));
}

#[test]
fn long_strings_are_clamped_on_a_char_boundary() {
    let msg = Message::Fatal {
        message: "é".repeat(MAX_STRING_LEN),
    };
    match Message::decode(&msg.encode()).unwrap() {
        Message::Fatal { message } => {
            assert!(message.len() <= MAX_STRING_LEN);
            assert!(message.chars().all(|c| c == 'é'));
        }
        other => panic!("{other:?}"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    /// Random bytes: never a panic, and anything accepted re-encodes to the same bytes.
    #[test]
    fn random_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(msg) = Message::decode(&body) {
            prop_assert_eq!(msg.encode(), body);
        }
    }

    /// Valid frames with random mutations (flip, insert, delete, truncate): never a panic.
    #[test]
    fn mutated_messages_never_panic(
        which in 0usize..12,
        edits in proptest::collection::vec((0usize..4, any::<usize>(), any::<u8>()), 1..6),
    ) {
        let mut body = sample_messages()[which].encode();
        for (kind, pos, byte) in edits {
            let at = if body.is_empty() { 0 } else { pos % body.len() };
            match kind {
                0 if !body.is_empty() => body[at] ^= byte | 1,
                1 => body.insert(at, byte),
                2 if !body.is_empty() => { body.remove(at); }
                _ => body.truncate(at),
            }
        }
        if let Ok(msg) = Message::decode(&body) {
            prop_assert_eq!(&msg.encode(), &body);
        }
        let mut frame = (body.len() as u32).to_le_bytes().to_vec();
        frame.extend_from_slice(&body);
        let _ = read_frame(&mut frame.as_slice());
    }
}
