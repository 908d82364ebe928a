//! The values a rule's key reads from a request (a JSON member by pointer, a form
//! field, a query parameter, a cookie) over arbitrary bodies: never a panic, and a
//! JSON value found is the one serde_json's own document model holds at the pointer.
//!
//! Input: the pointer's line, the field name's line, then the body.

#![no_main]

use libfuzzer_sys::fuzz_target;
use limiter_core::carried::{JsonPointer, cookie_value, form_field, json_value, query_value};
use serde_json::Value;

fuzz_target!(|input: &[u8]| {
    let mut lines = input.splitn(3, |&b| b == b'\n');
    let (Some(pointer), Some(name), Some(body)) = (lines.next(), lines.next(), lines.next()) else { return };
    let (Ok(pointer_text), Ok(name)) = (std::str::from_utf8(pointer), std::str::from_utf8(name)) else { return };
    if let Ok(pointer) = pointer_text.parse::<JsonPointer>()
        && let Some(found) = json_value(body, &pointer)
    {
        let document: Value = serde_json::from_slice(body).expect("a value was found in a body that is not JSON");
        match document.pointer(pointer_text).expect("found where the document has nothing") {
            Value::String(text) => assert_eq!(&found, text),
            Value::Bool(flag) => assert_eq!(found, flag.to_string()),
            Value::Number(number) => {
                let parsed: f64 = found.parse().expect("a number's text");
                assert_eq!(Some(parsed), number.as_f64(), "{found}");
            }
            other => panic!("{other} is not a key's value"),
        }
    }
    if let Some(field) = form_field(body, name)
        && let Ok(query) = std::str::from_utf8(body)
    {
        assert_eq!(query_value(query, name).as_deref(), Some(&*field), "a lone field is also the first");
    }
    if let Some(cookie) = cookie_value(body.split(|&b| b == b'\n'), name) {
        assert_eq!(cookie, cookie.trim_ascii());
    }
});
