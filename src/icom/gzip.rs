//! Whole-body gzip, both ways. Inflating stops one byte past the body limit,
//! so a gzip bomb costs at most `max_body_bytes` of memory.

use std::io::{Read, Write};

use flate2::Compression;
use flate2::read::MultiGzDecoder;
use flate2::write::GzEncoder;

use super::limits::WireError;

/// The two bytes every gzip member starts with.
pub const MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Compresses a whole body (fast level: bodies are small and latency matters).
pub fn compress(body: &[u8]) -> Result<Vec<u8>, WireError> {
    let mut encoder = GzEncoder::new(Vec::with_capacity(body.len() / 4 + 64), Compression::fast());
    encoder.write_all(body).map_err(|e| WireError::Gzip(e.to_string()))?;
    encoder.finish().map_err(|e| WireError::Gzip(e.to_string()))
}

/// Inflates `gz`, failing with `BodyTooLarge` as soon as the output would pass `max`.
pub fn decompress(gz: &[u8], max: usize) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(gz.len().saturating_mul(4).min(max));
    let cap = u64::try_from(max).unwrap_or(u64::MAX).saturating_add(1);
    MultiGzDecoder::new(gz).take(cap).read_to_end(&mut out).map_err(|e| WireError::Gzip(e.to_string()))?;
    if out.len() > max {
        return Err(WireError::BodyTooLarge { max }.counted());
    }
    Ok(out)
}

/// The first `max` inflated bytes of `gz`, as far as it can be read (errors end it).
pub fn inflate_prefix(gz: &[u8], max: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(gz.len().saturating_mul(4).min(max));
    let cap = u64::try_from(max).unwrap_or(u64::MAX);
    let mut reader = MultiGzDecoder::new(gz).take(cap);
    let mut buf = [0u8; 8192];
    while let Ok(n) = reader.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let body = b"<Envelope/>".repeat(100);
        assert_eq!(decompress(&compress(&body).unwrap(), body.len()).unwrap(), body);
    }

    #[test]
    fn bomb_stops_at_the_limit() {
        let bomb = compress(&vec![0u8; 16 * 1024 * 1024]).unwrap();
        assert!(bomb.len() < 128 * 1024, "a real bomb: {} compressed bytes", bomb.len());
        assert_eq!(decompress(&bomb, 1024 * 1024), Err(WireError::BodyTooLarge { max: 1024 * 1024 }));
    }

    #[test]
    fn exactly_the_limit_passes() {
        let body = vec![7u8; 1000];
        assert_eq!(decompress(&compress(&body).unwrap(), 1000).unwrap().len(), 1000);
        assert!(matches!(decompress(&compress(&body).unwrap(), 999), Err(WireError::BodyTooLarge { .. })));
    }

    #[test]
    fn garbage_and_truncation_are_gzip_errors() {
        assert!(matches!(decompress(b"not gzip", 100), Err(WireError::Gzip(_))));
        let gz = compress(b"hello hello hello").unwrap();
        assert!(matches!(decompress(&gz[..gz.len() - 5], 100), Err(WireError::Gzip(_))));
    }
}
