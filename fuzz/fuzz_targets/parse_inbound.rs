//! Fuzz target: a stream-read response (first line Content-Type, then the
//! body, gzip when it starts with the gzip magic) through inflate →
//! multipart → envelope. It must never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    cabine::icom::fuzz_entry(data);
});
