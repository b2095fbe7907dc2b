//! Zeroed host memory for arenas and output buffers.
//!
//! Small allocations come from the global allocator, cache-line aligned.
//! Large ones (2 MiB and more) are mapped from the OS on Linux, 2 MiB
//! aligned and advised for transparent huge pages (`MADV_HUGEPAGE`): the
//! first touch of each 2 MiB faults once instead of 512 times, and a buffer
//! streamed through stays within few TLB entries. Either way the memory
//! reads as zeros, and untouched pages cost nothing until written. Memory
//! the system refuses is an error, never an abort.

use std::alloc::Layout;
use std::ptr::NonNull;

use crate::error::{Error, Result};

/// Alignment of every allocation, in bytes: a cache line.
pub(crate) const LINE: usize = 64;

/// The size from which allocations are mapped for huge pages.
pub const HUGE_PAGE: usize = 2 << 20;

/// A line's alignment, for the address of an empty allocation.
#[repr(C, align(64))]
struct Line([u8; LINE]);

/// One zeroed allocation of at least `bytes` bytes, `LINE`-aligned.
pub(crate) struct Pages {
    ptr: NonNull<u8>,
    bytes: usize,
    how: How,
}

enum How {
    /// Nothing allocated (zero bytes).
    Empty,
    /// From the global allocator with this layout.
    Heap(Layout),
    /// Mapped from the OS: the whole mapping, which `ptr` lies in.
    #[cfg(target_os = "linux")]
    Mapped { base: *mut libc::c_void, len: usize },
}

// SAFETY: `Pages` owns its memory like a `Box<[u8]>`; who reads and writes
// it, and when, is up to its owner (the arena's rules).
unsafe impl Send for Pages {}
// SAFETY: as above.
unsafe impl Sync for Pages {}

impl Pages {
    /// `bytes` zeroed bytes (rounded up to whole lines), or an error when
    /// the system refuses them: never an abort.
    pub(crate) fn zeroed(bytes: usize) -> Result<Pages> {
        let refused = |why: &str| Error::OutOfMemory {
            what: format!("allocating {}", crate::meta::human_bytes(bytes)),
            message: why.to_string(),
        };
        let bytes = bytes
            .checked_next_multiple_of(LINE)
            .ok_or_else(|| refused("the size overflows"))?;
        if bytes == 0 {
            return Ok(Pages {
                ptr: NonNull::<Line>::dangling().cast(),
                bytes: 0,
                how: How::Empty,
            });
        }
        #[cfg(target_os = "linux")]
        if bytes >= HUGE_PAGE
            && let Some(p) = Pages::mapped(bytes)
        {
            return Ok(p);
        }
        let layout = Layout::from_size_align(bytes, LINE).map_err(|_| refused("the size overflows"))?;
        // SAFETY: the layout has a nonzero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).ok_or_else(|| refused("the system refused it"))?;
        Ok(Pages {
            ptr,
            bytes,
            how: How::Heap(layout),
        })
    }

    /// A fresh anonymous mapping, 2 MiB aligned, advised for huge pages;
    /// `None` if the OS refuses (the heap is tried next).
    #[cfg(target_os = "linux")]
    fn mapped(bytes: usize) -> Option<Pages> {
        let len = bytes.checked_add(HUGE_PAGE)?;
        // SAFETY: an anonymous private mapping at an address of the OS's
        // choosing touches no existing memory.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return None;
        }
        let skip = (base as usize).next_multiple_of(HUGE_PAGE) - base as usize;
        // SAFETY: `skip < HUGE_PAGE`, so `bytes` from there stay in the mapping.
        let start = unsafe { base.cast::<u8>().add(skip) };
        // Advice only: where the kernel has no huge pages this fails and
        // the mapping works with small ones.
        // SAFETY: the range lies in the mapping just made.
        unsafe { libc::madvise(start.cast(), bytes, libc::MADV_HUGEPAGE) };
        Some(Pages {
            ptr: NonNull::new(start)?,
            bytes,
            how: How::Mapped { base, len },
        })
    }

    /// Bytes allocated.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// The first byte.
    pub(crate) fn base(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Whether the memory was mapped for huge pages.
    #[cfg(test)]
    pub(crate) fn is_mapped(&self) -> bool {
        #[cfg(target_os = "linux")]
        if let How::Mapped { .. } = self.how {
            return true;
        }
        false
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        match self.how {
            How::Empty => {}
            // SAFETY: allocated with this layout, and freed once.
            How::Heap(layout) => unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) },
            // SAFETY: the mapping made in `mapped`, unmapped once.
            #[cfg(target_os = "linux")]
            How::Mapped { base, len } => unsafe {
                libc::munmap(base, len);
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_zeroed_and_aligned_small_and_large() {
        for bytes in [0, 1, 100, 4096, HUGE_PAGE, 3 * HUGE_PAGE + 5] {
            let p = Pages::zeroed(bytes).unwrap();
            assert!(p.bytes() >= bytes && p.bytes().is_multiple_of(LINE));
            assert!((p.base() as usize).is_multiple_of(LINE));
            if p.bytes() > 0 {
                // SAFETY: `bytes()` bytes from `base()` are ours.
                let s = unsafe { std::slice::from_raw_parts_mut(p.base(), p.bytes()) };
                assert!(s.iter().all(|&b| b == 0));
                s.fill(7);
            }
            if cfg!(target_os = "linux") && bytes >= HUGE_PAGE {
                assert!(p.is_mapped());
                assert!((p.base() as usize).is_multiple_of(HUGE_PAGE), "2 MiB aligned");
            }
        }
    }

    #[test]
    fn memory_the_system_cannot_give_is_an_error_not_an_abort() {
        for bytes in [usize::MAX, usize::MAX / 2, 1 << 60] {
            let e = Pages::zeroed(bytes).err().expect("no machine has this much");
            let m = e.to_string();
            assert!(m.starts_with("out of memory: allocating "), "{m}");
        }
    }
}
