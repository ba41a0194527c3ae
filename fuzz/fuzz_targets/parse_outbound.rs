//! Fuzz target: a bus request (subject line, `Name: value` header lines, an
//! empty line, the body) through the outbound request parser: valid and
//! storable as it is, or invalid with a clean reason. It must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = cabine::outbound::ingress::fuzz_entry(data);
});
