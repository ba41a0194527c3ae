//! Domain values shared by the actors and the adapters: ISPB, channel, pool
//! size and slot, each validated once (at config load) so the rest of the code
//! can rely on it.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A participant's ISPB: exactly 8 characters in `[0-9A-Z]`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Ispb(String);

impl Ispb {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Ispb {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        let ok = s.len() == 8 && s.bytes().all(|b| b.is_ascii_digit() || b.is_ascii_uppercase());
        if ok { Ok(Ispb(s)) } else { Err(format!("an ISPB is 8 characters [0-9A-Z], got {s:?}")) }
    }
}

impl std::str::FromStr for Ispb {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ispb::try_from(s.to_owned())
    }
}

impl From<Ispb> for String {
    fn from(i: Ispb) -> String {
        i.0
    }
}

impl fmt::Display for Ispb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Ispb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ispb({})", self.0)
    }
}

/// One of the participant's two ICOM channels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChannelId {
    /// Primary channel (`icom.pi.rsfn.net.br:16422`).
    Cpm,
    /// Secondary channel (`icom-sec…:17422`).
    Csm,
}

impl ChannelId {
    pub const ALL: [ChannelId; 2] = [ChannelId::Cpm, ChannelId::Csm];

    pub fn as_str(self) -> &'static str {
        match self {
            ChannelId::Cpm => "cpm",
            ChannelId::Csm => "csm",
        }
    }
}

impl fmt::Display for ChannelId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ChannelId {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "cpm" => Ok(ChannelId::Cpm),
            "csm" => Ok(ChannelId::Csm),
            other => Err(format!("a channel is \"cpm\" or \"csm\", got {other:?}")),
        }
    }
}

/// A count of leased slots or concurrent requests: 1..=6, the Central Bank's cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct PoolSize(u8);

impl PoolSize {
    /// The Central Bank's cap on simultaneous requests per participant and channel.
    pub const CAP: u8 = 6;

    pub fn get(self) -> u8 {
        self.0
    }
}

impl TryFrom<u64> for PoolSize {
    type Error = String;
    fn try_from(n: u64) -> Result<Self, String> {
        if (1..=u64::from(Self::CAP)).contains(&n) {
            Ok(PoolSize(n as u8))
        } else {
            Err(format!("must be in 1..={}, got {n}", Self::CAP))
        }
    }
}

impl From<PoolSize> for u64 {
    fn from(p: PoolSize) -> u64 {
        u64::from(p.0)
    }
}

/// One stream slot of a channel: `slot/cpm/3` owns one ICOM stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SlotId {
    pub channel: ChannelId,
    /// 1-based, at most [`PoolSize::CAP`].
    pub n: u8,
}

impl fmt::Display for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.channel, self.n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ispb_accepts_eight_digits_or_capitals_only() {
        assert!(Ispb::try_from("99999010".to_owned()).is_ok());
        assert!(Ispb::try_from("0003816A".to_owned()).is_ok());
        for bad in ["9999901", "999990100", "9999901a", "9999-010", ""] {
            assert!(Ispb::try_from(bad.to_owned()).is_err(), "{bad}");
        }
    }

    #[test]
    fn pool_size_is_one_to_six() {
        assert!(PoolSize::try_from(0).is_err());
        assert!(PoolSize::try_from(7).is_err());
        assert_eq!(PoolSize::try_from(6).unwrap().get(), 6);
    }
}
