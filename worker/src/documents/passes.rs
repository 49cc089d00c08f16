//! How one request's token rows are cut into passes. A pass pads every row to its longest
//! (`"longest"` padding), so rows are taken shortest first: each pass holds rows of nearly
//! one length, and one long document no longer makes every short one beside it cost its
//! length (32 short rows and one of 512 tokens in arrival order cost 33 × 512). A pass holds
//! at most the token budget (`max_batch_tokens`: rows × padded length), so a pass of long
//! rows holds fewer of them; a single row longer than the budget runs alone. The answer
//! keeps the request's order: each pass says which rows it holds.

/// The passes over rows of `lengths` tokens: shortest rows first, at most `max_rows` rows
/// each and, with a budget of `tokens`, at most that many tokens once padded (to the pass's
/// longest row, or to `width` for `"max_length"` padding); each pass lists its rows' indices
/// (into `lengths`), shortest first.
pub fn by_length(
    lengths: &[usize],
    max_rows: usize,
    tokens: Option<usize>,
    width: Option<usize>,
) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    // Stable: rows of one length keep their order.
    order.sort_by_key(|&i| lengths[i]);
    let (max_rows, budget) = (max_rows.max(1), tokens.unwrap_or(usize::MAX));
    let mut passes: Vec<Vec<usize>> = Vec::new();
    let mut pass: Vec<usize> = Vec::new();
    for i in order {
        // Shortest first: the row joining is the pass's longest.
        let padded = (pass.len() + 1).saturating_mul(width.unwrap_or(lengths[i]));
        if !pass.is_empty() && (pass.len() == max_rows || padded > budget) {
            passes.push(std::mem::take(&mut pass));
        }
        pass.push(i);
    }
    if !pass.is_empty() {
        passes.push(pass);
    }
    passes
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
        let passes = by_length(&lengths, 3, None, None);
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
        assert_eq!(
            padded(by_length(&lengths, 8, None, None)),
            16 * 4 + 16 * 100
        );
    }

    #[test]
    fn a_pass_never_holds_more_tokens_than_the_budget_but_a_long_row_runs_alone() {
        let lengths = [10, 3, 50, 10, 10, 4, 10, 200];
        let passes = by_length(&lengths, 8, Some(40), None);
        assert_eq!(
            passes,
            vec![vec![1, 5, 0, 3], vec![4, 6], vec![2], vec![7]],
            "3, 4, 10, 10 (40 padded); the other two of 10; 50 and 200 alone"
        );
        for p in &passes {
            let (_, padded) = tokens(p.iter().map(|&i| lengths[i]), None);
            assert!(padded <= 40 || p.len() == 1, "{p:?}");
        }
        // With "max_length" padding every row costs the width.
        let fixed = by_length(&[1, 2, 3, 4, 5], 8, Some(64), Some(32));
        assert_eq!(fixed, vec![vec![0, 1], vec![2, 3], vec![4]]);
        // The rows' cap still holds under a large budget.
        assert_eq!(by_length(&[1; 5], 2, Some(1000), None).len(), 3);
    }

    #[test]
    fn tokens_count_real_and_padded() {
        assert_eq!(tokens([3, 5, 2].into_iter(), None), (10, 15));
        assert_eq!(tokens([3, 5, 2].into_iter(), Some(8)), (10, 24));
        assert_eq!(tokens(std::iter::empty(), None), (0, 0));
    }
}
