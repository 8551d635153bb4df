//! sluicegate's global allocator: mimalloc, asked for a block by its size alone whenever
//! the block's alignment is at most a machine word.
//!
//! This is the one crate of the project with `unsafe` code (sluicegate itself forbids
//! it): a `GlobalAlloc` cannot be written without it. It exists because the `mimalloc`
//! crate's allocator asks for every block with `mi_malloc_aligned`, whose fast path
//! serves only blocks up to 1 KiB whose size class happens to have a free block at the
//! right alignment; every other request (a request's 3 KB state, or any size whose free
//! list is momentarily empty) over-allocates by the alignment and lands one size class
//! up, so the next request of that size misses its own class again. Measured on the
//! forwarded and rejected paths (docs/performance.md): about 300 fewer instructions a
//! request, and a request in progress 500 bytes smaller.
//!
//! Why asking by size is enough: every mimalloc block starts on a machine word (its
//! size classes are whole words, its pages word-aligned, and debug padding goes after
//! the block), so a block is aligned for any layout whose alignment is at most a word.
//! Larger alignments still go through `mi_malloc_aligned`.

use core::alloc::{GlobalAlloc, Layout};
use core::ffi::c_void;

use libmimalloc_sys as mi;

/// The alignment every mimalloc block has.
const WORD: usize = core::mem::size_of::<usize>();

/// mimalloc, by size where the alignment allows (the crate's doc).
#[derive(Clone, Copy, Debug, Default)]
pub struct Allocator;

// SAFETY (for every method): mimalloc's functions return null or a block of at least the
// size asked for, aligned to a word (the crate's doc) or to the alignment passed; a block
// is freed or resized only by the functions of the same allocator, as `GlobalAlloc`'s
// callers guarantee.
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let block = match layout.align() <= WORD {
            // SAFETY: see the impl.
            true => unsafe { mi::mi_malloc(layout.size()) },
            // SAFETY: see the impl; `Layout`'s alignment is a power of two.
            false => unsafe { mi::mi_malloc_aligned(layout.size(), layout.align()) },
        };
        block.cast()
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let block = match layout.align() <= WORD {
            // SAFETY: see the impl.
            true => unsafe { mi::mi_zalloc(layout.size()) },
            // SAFETY: see the impl.
            false => unsafe { mi::mi_zalloc_aligned(layout.size(), layout.align()) },
        };
        block.cast()
    }

    #[inline]
    unsafe fn dealloc(&self, block: *mut u8, _layout: Layout) {
        // SAFETY: `block` came from this allocator (`GlobalAlloc`'s contract).
        unsafe { mi::mi_free(block.cast::<c_void>()) }
    }

    #[inline]
    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // The block keeps its alignment: `layout`'s.
        let moved = match layout.align() <= WORD {
            // SAFETY: `block` came from this allocator; see the impl.
            true => unsafe { mi::mi_realloc(block.cast::<c_void>(), new_size) },
            // SAFETY: as above.
            false => unsafe { mi::mi_realloc_aligned(block.cast::<c_void>(), new_size, layout.align()) },
        };
        moved.cast()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Blocks of every size class a request uses, small and large, at every alignment up
    /// to a page: aligned as asked, writable, resized with their contents kept.
    #[test]
    fn blocks_are_aligned_as_their_layout_asks() {
        let allocator = Allocator;
        for size in [1, 3, 8, 24, 40, 100, 576, 1000, 1025, 3072, 3079, 70_000] {
            for align in [1, 2, 4, 8, 16, 64, 4096] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: a non-zero size; every block is freed with its layout.
                unsafe {
                    let block = allocator.alloc(layout);
                    assert!(!block.is_null());
                    assert_eq!(block as usize % align, 0, "size {size}, align {align}");
                    block.write_bytes(0xa5, size);
                    let zeroed = allocator.alloc_zeroed(layout);
                    assert_eq!(zeroed as usize % align, 0, "zeroed: size {size}, align {align}");
                    assert!((0..size).all(|i| *zeroed.add(i) == 0));
                    let grown = allocator.realloc(block, layout, size * 3);
                    assert_eq!(grown as usize % align, 0, "grown: size {size}, align {align}");
                    assert!((0..size).all(|i| *grown.add(i) == 0xa5));
                    allocator.dealloc(grown, Layout::from_size_align(size * 3, align).unwrap());
                    allocator.dealloc(zeroed, layout);
                }
            }
        }
    }
}
