//! How one request's token rows are cut into passes. A pass pads every row to its longest
//! (`"longest"` padding), so rows are taken shortest first: each pass holds rows of nearly
//! one length, and one long document no longer makes every short one beside it cost its
//! length (32 short rows and one of 512 tokens in arrival order cost 33 × 512). The answer
//! keeps the request's order: each pass says which rows it holds.

/// The passes over rows of `lengths` tokens: at most `max_rows` rows each, shortest rows
/// first; each pass lists its rows' indices (into `lengths`), shortest first.
pub fn by_length(lengths: &[usize], max_rows: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    // Stable: rows of one length keep their order.
    order.sort_by_key(|&i| lengths[i]);
    order
        .chunks(max_rows.max(1))
        .map(<[usize]>::to_vec)
        .collect()
}

/// Tokens given to the model by one pass of rows of `lengths` tokens padded to `width`:
/// (real, padded), the padding efficiency being real ÷ padded.
pub fn tokens(lengths: impl Iterator<Item = usize>, width: Option<usize>) -> (u64, u64) {
    let (mut real, mut rows, mut longest) = (0u64, 0u64, 0usize);
    for l in lengths {
        real += l as u64;
        rows += 1;
        longest = longest.max(l);
    }
    (real, rows * width.unwrap_or(longest) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_taken_shortest_first_and_every_row_once() {
        let lengths = [9, 2, 30, 2, 5, 9, 1];
        let passes = by_length(&lengths, 3);
        assert_eq!(passes, vec![vec![6, 1, 3], vec![4, 0, 5], vec![2]]);
        let mut all: Vec<usize> = passes.concat();
        all.sort_unstable();
        assert_eq!(all, (0..lengths.len()).collect::<Vec<_>>());
    }

    #[test]
    fn sorting_pads_less_than_arrival_order() {
        // Short and long alternating: in arrival order every pass pads to the long one.
        let lengths: Vec<usize> = (0..32).map(|i| if i % 2 == 0 { 4 } else { 100 }).collect();
        let padded = |passes: Vec<Vec<usize>>| -> u64 {
            passes
                .iter()
                .map(|p| tokens(p.iter().map(|&i| lengths[i]), None).1)
                .sum()
        };
        let arrival: Vec<Vec<usize>> = (0..32)
            .collect::<Vec<_>>()
            .chunks(8)
            .map(<[usize]>::to_vec)
            .collect();
        assert_eq!(padded(arrival), 32 * 100);
        assert_eq!(padded(by_length(&lengths, 8)), 16 * 4 + 16 * 100);
    }

    #[test]
    fn tokens_count_real_and_padded() {
        assert_eq!(tokens([3, 5, 2].into_iter(), None), (10, 15));
        assert_eq!(tokens([3, 5, 2].into_iter(), Some(8)), (10, 24));
        assert_eq!(tokens(std::iter::empty(), None), (0, 0));
    }
}
