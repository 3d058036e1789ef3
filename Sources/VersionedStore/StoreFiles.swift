import DocumentEngine
import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Positioned I/O on a store's own files (packs, intent logs), whole or not at all.
package enum FileIO {
    /// `pwrite(2)` of all of `buffer` at `offset`, again after an interruption or a short write:
    /// 0, or the errno of the write that failed.
    package static func write(_ fd: Int32, _ buffer: UnsafeRawBufferPointer, at offset: Int64) -> Int32 {
        guard let base = buffer.baseAddress else { return 0 }
        var done = 0
        while done < buffer.count {
            let count = pwrite(fd, base + done, buffer.count - done, off_t(offset) + off_t(done))
            if count < 0 {
                if errno == EINTR { continue }
                return errno
            }
            done += count
        }
        return 0
    }

    /// `pread(2)` into all of `buffer` from `offset`, again after an interruption or a short
    /// read: the bytes read (fewer only at the end of the file), or the errno of the read that
    /// failed.
    package static func read(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer, at offset: Int64)
        -> Result<
            Int, Failure
        >
    {
        guard let base = buffer.baseAddress else { return .success(0) }
        var done = 0
        while done < buffer.count {
            let count = pread(fd, base + done, buffer.count - done, off_t(offset) + off_t(done))
            if count < 0 {
                if errno == EINTR { continue }
                return .failure(Failure(code: errno))
            }
            if count == 0 { break }
            done += count
        }
        return .success(done)
    }

    /// An errno, as an error.
    package struct Failure: Error {
        package var code: Int32
    }
}

/// Errors and syncs of a store's own files.
package enum StoreFiles {
    /// An error for a system call on the store's files that failed with `code`.
    package static func systemError(_ code: Int32, path: String, doing what: String) -> DocumentStoreError {
        if code == ENOSPC || code == EDQUOT { return .noSpace(path) }
        return .io("cannot \(what) the store \(path): \(String(cString: strerror(code)))")
    }

    /// `fsync(2)`, again after an interruption; a failure is reported for `path`.
    package static func fsyncRetrying(_ fd: Int32, path: String, doing what: String) throws {
        while fsync(fd) != 0 {
            if errno != EINTR { throw systemError(errno, path: path, doing: what) }
        }
    }

    /// Syncs `folder` (the empty path: the current one), so that entries made in it survive a
    /// power cut; a failure is reported for `path`.
    package static func syncFolder(_ folder: String, path: String, doing what: String) throws {
        let fd = open(folder.isEmpty ? "." : folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw systemError(errno, path: path, doing: what) }
        defer { close(fd) }
        try fsyncRetrying(fd, path: path, doing: what)
    }
}
