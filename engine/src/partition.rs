//! Kafka's default partitioner, bit for bit, so that `topk run`, the load generator and a
//! Kafka producer put every key on the same logical shard.

const SEED: u32 = 0x9747_b28c;
const M: u32 = 0x5bd1_e995;

/// Message keys up to this length are assembled on the stack for [`shard_for`]; longer ones
/// (rare) on the heap.
const JOINED_ON_STACK: usize = 256;

/// Kafka's `Utils.murmur2` (seed 0x9747b28c), returned as the unsigned bit pattern of the
/// Java `int`.
pub fn murmur2(data: &[u8]) -> u32 {
    let mut h = SEED ^ data.len() as u32;
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        let mut k = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    // Kafka xors the one to three tail bytes in at their little-endian places.
    let tail = words.remainder();
    if !tail.is_empty() {
        let mut word = [0u8; 4];
        word[..tail.len()].copy_from_slice(tail);
        h ^= u32::from_le_bytes(word);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

/// Partition of a keyed record under Kafka's default partitioner: `toPositive(murmur2) % n`.
pub fn partition_for(message_key: &[u8], partitions: u32) -> u32 {
    to_partition(murmur2(message_key), partitions)
}

/// Java's `toPositive(hash) % n`.
fn to_partition(hash: u32, partitions: u32) -> u32 {
    (hash & 0x7fff_ffff) % partitions.max(1)
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

/// Shard of an event: the partition of its message key, assembled on the stack. Hashing one
/// contiguous copy takes about half the instructions of feeding metric, `|`, scope, `|` and
/// key in turn, whose seams break the word alignment and go through the hash byte by byte
/// (callgrind, `ingest` bench, a 25-byte message key: ~430 instructions before, ~210 after).
pub fn shard_for(metric: &str, scope: &str, key: &str, shards: u32) -> u32 {
    let len = metric.len() + scope.len() + key.len() + 2;
    if len > JOINED_ON_STACK {
        return partition_for(message_key(metric, scope, key).as_bytes(), shards);
    }
    let mut joined = [0u8; JOINED_ON_STACK];
    let (scope_at, key_at) = (metric.len() + 1, metric.len() + scope.len() + 2);
    joined[..metric.len()].copy_from_slice(metric.as_bytes());
    joined[scope_at - 1] = b'|';
    joined[scope_at..key_at - 1].copy_from_slice(scope.as_bytes());
    joined[key_at - 1] = b'|';
    joined[key_at..len].copy_from_slice(key.as_bytes());
    partition_for(&joined[..len], shards)
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

    proptest::proptest! {
        #[test]
        fn shard_for_equals_partition_of_the_message_key(
            // Up to 3 x 199 bytes: both sides of the stack buffer's length.
            metric in ".{0,199}",
            scope in ".{0,199}",
            key in ".{0,199}",
            shards in 1u32..300,
        ) {
            let want = partition_for(message_key(&metric, &scope, &key).as_bytes(), shards);
            proptest::prop_assert_eq!(shard_for(&metric, &scope, &key, shards), want);
        }
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
