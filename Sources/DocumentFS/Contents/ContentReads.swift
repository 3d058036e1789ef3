import FUSE
import Foundation
import SystemPackage
import VersionedStore

extension MountRoom {
    /// The largest read whose buffer is page-aligned (``read(_:_:)``).
    static var alignedReads: Int { 64 << 10 }

    /// The bytes of a planned read, read without the lock.
    func read(_ plan: FileContents.ReadPlan) throws(Errno) -> [UInt8] { try read(plan) { [UInt8]($0) } }

    /// Reads the bytes of a planned read without the lock and hands them to `body`.
    ///
    /// A small read's buffer is page-aligned: a 4 KiB read then fills one page, which the
    /// store's `pread` and the kernel's copy of the reply each touch once (an array's bytes begin
    /// past its header, so they straddled two). A large one's is not: glibc's aligned
    /// allocations of a megabyte at a time left a daemon streaming a file 20 MiB larger (B7).
    func read<T>(_ plan: FileContents.ReadPlan, _ body: (UnsafeRawBufferPointer) -> T) throws(Errno) -> T {
        let buffer = Self.buffer(for: plan)
        defer { buffer.deallocate() }
        try fill(buffer, from: plan)
        return body(UnsafeRawBufferPointer(buffer))
    }

    /// A buffer for the bytes of `plan` (``read(_:_:)``).
    static func buffer(for plan: FileContents.ReadPlan) -> UnsafeMutableRawBufferPointer {
        UnsafeMutableRawBufferPointer.allocate(
            byteCount: plan.count, alignment: plan.count <= alignedReads ? 4096 : 16)
    }

    /// Reads the bytes of `plan` into `buffer`, as long as the plan, without the lock.
    func fill(_ buffer: UnsafeMutableRawBufferPointer, from plan: FileContents.ReadPlan) throws(Errno) {
        guard let base = buffer.baseAddress, plan.count > 0 else { return }
        // Zeroed only when the pieces leave gaps (holes): otherwise they fill it all.
        let covered = plan.spill.reduce(0) { $0 + $1.count } + plan.store.reduce(0) { $0 + $1.count }
        if covered != plan.count { memset(base, 0, plan.count) }
        try plan.readSpill(into: buffer)
        for piece in plan.store {
            let within = piece.destination..<min(plan.count, piece.destination + piece.count)
            guard !within.isEmpty else { continue }
            let read = try baseBytes(
                piece.source, offset: piece.offset,
                into: UnsafeMutableRawBufferPointer(rebasing: buffer[within]))
            // Past the end of what the store holds (a base shorter than the file).
            if read < within.count { memset(base + within.lowerBound + read, 0, within.count - read) }
        }
    }

    /// The clean bytes `[offset, offset+count)` of `base`: from its text, or from the store.
    func baseBytes(_ base: ContentBase, offset: Int64, count: Int) throws(Errno) -> Data {
        if let held = heldBytes(base, offset: offset, count: count) { return held }
        return try storeCall {
            try store.readContents(of: base.node, at: base.version, offset: offset, count: count)
        }
    }

    /// ``baseBytes(_:offset:count:)`` into `buffer`: the count read, fewer than it holds only at
    /// the end of the base.
    func baseBytes(_ base: ContentBase, offset: Int64, into buffer: UnsafeMutableRawBufferPointer)
        throws(Errno) -> Int
    {
        if let held = heldBytes(base, offset: offset, count: buffer.count) {
            return held.copyPrefix(into: buffer)
        }
        return try storeCall {
            try store.readContents(of: base.node, at: base.version, offset: offset, into: buffer)
        }
    }

    /// The bytes `[offset, offset+count)` of a base the mount holds (its text, or bytes kept
    /// whole); nil when the store holds them.
    private func heldBytes(_ base: ContentBase, offset: Int64, count: Int) -> Data? {
        guard let text = base.text?.text ?? base.bytes else { return nil }
        let start = Int(clamping: max(0, min(offset, Int64(text.count))))
        let end = start + min(text.count - start, max(0, count))
        return text.subdata(in: text.startIndex + start..<text.startIndex + end)
    }
}
