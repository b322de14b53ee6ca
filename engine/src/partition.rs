//! Kafka's default partitioner, bit for bit, so that `topk run`, the load generator and a
//! Kafka producer put every key on the same logical shard.

/// Kafka's `Utils.murmur2` (seed 0x9747b28c), returned as the unsigned bit pattern of the
/// Java `int`.
pub fn murmur2(data: &[u8]) -> u32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for chunk in &mut chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// Partition of a keyed record under Kafka's default partitioner: `toPositive(murmur2) % n`.
pub fn partition_for(message_key: &[u8], partitions: u32) -> u32 {
    (murmur2(message_key) & 0x7fff_ffff) % partitions.max(1)
}

/// The Kafka message key of an event: `metric|scope|key`.
pub fn message_key(metric: &str, scope: &str, key: &str) -> String {
    let mut out = String::with_capacity(metric.len() + scope.len() + key.len() + 2);
    out.push_str(metric);
    out.push('|');
    out.push_str(scope);
    out.push('|');
    out.push_str(key);
    out
}

/// Shard of an event, computed without allocating.
pub fn shard_for(metric: &str, scope: &str, key: &str, shards: u32) -> u32 {
    let mut buf = [0u8; 256];
    let len = metric.len() + scope.len() + key.len() + 2;
    if len <= buf.len() {
        let mut at = 0;
        for (i, part) in [metric, scope, key].into_iter().enumerate() {
            if i > 0 {
                buf[at] = b'|';
                at += 1;
            }
            buf[at..at + part.len()].copy_from_slice(part.as_bytes());
            at += part.len();
        }
        partition_for(&buf[..len], shards)
    } else {
        partition_for(message_key(metric, scope, key).as_bytes(), shards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectors of Kafka's own `UtilsTest.testMurmur2`, as Java signed ints.
    #[test]
    fn matches_kafka_java_vectors() {
        let cases: [(&[u8], i32); 7] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
            (&[12, 42, 56, 24, 109, 111], 274_204_207),
        ];
        for (input, want) in cases {
            assert_eq!(murmur2(input) as i32, want, "{input:?}");
        }
    }

    #[test]
    fn partition_is_to_positive_mod_n() {
        // -973932308 & 0x7fffffff = 1173551340
        assert_eq!(partition_for(b"21", 1 << 31), 1_173_551_340);
        assert_eq!(partition_for(b"21", 64), 1_173_551_340 % 64);
    }

    #[test]
    fn shard_for_equals_partition_of_message_key() {
        let long = "x".repeat(300);
        for (m, s, k) in [
            ("api", "", "GET /"),
            ("api", "eu", "k"),
            ("m", "s", long.as_str()),
        ] {
            let want = partition_for(message_key(m, s, k).as_bytes(), 64);
            assert_eq!(shard_for(m, s, k, 64), want);
        }
    }
}
