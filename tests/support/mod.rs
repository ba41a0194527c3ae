//! Test support shared by the ICOM client tests.

pub mod raw_http;
