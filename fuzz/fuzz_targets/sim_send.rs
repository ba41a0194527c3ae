//! Fuzz target: a send to the simulator (Content-Type line, Content-Encoding
//! line, body) through its framing, gunzip, multipart split and envelope
//! reading. It must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cabine::sim::fuzz_entry(data);
});
