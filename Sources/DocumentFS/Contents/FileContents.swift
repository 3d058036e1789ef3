import CLinuxSupport
import DocumentEngine
import Foundation
import Synchronization
import SystemPackage
import VersionedStore

#if canImport(Glibc)
    import Glibc
#endif

/// Where a file's clean bytes come from: a wrapper's contents in the store at one version.
struct ContentBase: Sendable, Equatable {
    var node: StoreNodeID
    var version: VersionID?
    /// Bytes at or past this read as zeros.
    var size: Int64
    /// With `archives=xml`, a stored binary property list read as its XML text: the bytes come
    /// from ``PropertyListText/text`` (and ``size`` is its length), not from the store.
    var text: PropertyListText? = nil
    /// Bytes the mount makes up (a Trash item's `.trashinfo`), read instead of the store's.
    var bytes: Data? = nil

    /// A file with no stored bytes (a new file).
    static func empty(_ node: StoreNodeID) -> ContentBase { ContentBase(node: node, version: nil, size: 0) }

    static func == (a: ContentBase, b: ContentBase) -> Bool {
        a.node == b.node && a.version == b.version && a.size == b.size && a.text === b.text
            && a.bytes == b.bytes
    }
}

/// The contents of one regular file as the mount sees it: clean bytes from the store (the
/// base) under layers of written pages.
///
/// Saving freezes the layers (``freeze()``) and starts a new top layer for writes that arrive
/// during the save; a successful save makes the frozen state the new base, a failed one keeps
/// the layers for the next try. Part of the view, so used only under the view lock
/// (``ViewState``); what leaves it are values: the plans (``ChangePlan``, ``ReadPlan``), whose
/// spill bytes are read and written without the lock, and a save's ``Snapshot``.
final class FileContents {
    /// Names these contents outside the view lock, in a save's ``Snapshot``.
    let identity = ContentsIdentity()
    var base: ContentBase
    /// Oldest first; the last one takes writes.
    private(set) var layers: [SpillLayer] = []
    /// How many of the first layers a running save has frozen.
    private(set) var frozen = 0
    /// The state an `fsync` logged in the store's intent log while the file was being written
    /// (``hold(_:)``): its layers stay frozen, for the saves that come before the file's own
    /// next close or fsync to store.
    private(set) var checkpoint: Snapshot?
    /// The kernel set the file's size while the pages below it may still be in its writeback
    /// cache (an `ftruncate` after a write, with the file open for writing): what the mount has
    /// reads as zeros there until the kernel writes them back, which it has done by the file's
    /// next `fsync` or close. Until then only those save the file's bytes.
    var sizeAhead = false
    var size: Int64
    /// Bumped when another process's save replaced the base: handles opened before then keep
    /// reading what they opened.
    var generation: UInt64 = 0
    /// Bumped by every write and truncation, so that a compiled text is known to be current.
    private(set) var edits: UInt64 = 0
    /// With `archives=xml`: the file is stored as a binary property list of this kind and shown
    /// as text, so what is written must compile back to one.
    var propertyList: PropertyListText.Kind?
    /// The text shown for the property list whose place this file took (a rename onto it, or a
    /// new file under the name it left): written back unchanged, it stores those bytes.
    var replaces: PropertyListText?
    /// A change is between its plan and its commit (or undo): its spill I/O may be writing into
    /// the top layer, so a save must not freeze the layers until it ends.
    private(set) var changing = false
    /// The last compile of the written text (``edits`` at the time, and its outcome).
    var compiled: (edits: UInt64, outcome: Result<PropertyListText, PropertyListTextError>)?
    let pageSize: Int
    let spill: SpillFiles
    /// Bytes written in order from offset 0 since the file was last empty (new, or truncated
    /// to nothing): every byte below is written. Nil once the file has stored bytes again, or
    /// writes came too far out of order.
    private(set) var appended: Int64?
    /// Writes past ``appended`` that came before the ones below them (a few at most: requests
    /// of one file run one at a time, but not always in the order the kernel sent them).
    private var ahead: [Range<Int64>] = []
    /// The store's work on the bytes below ``appended`` while they are written, and how many of
    /// them it was told are final: a change below that many cancels it.
    private(set) var preparation: (any ContentsPreparation)?
    private(set) var prepared: Int64 = 0
    /// The layer that holds those bytes: a change in another layer cancels the preparation.
    private var preparedLayer: SpillLayer?
    /// The store prepares no contents: not asked again.
    private var unprepared = false

    /// The spill's unit: the kernel's page, so that the writes of its page cache (whole pages)
    /// never take in old bytes. With a store chunk (256 KiB) as the unit, a 4 KiB random write
    /// read and copied its whole chunk first.
    static let defaultPageSize = 4096

    init(base: ContentBase, pageSize: Int = FileContents.defaultPageSize, spill: SpillFiles) {
        self.base = base
        self.size = base.size
        self.pageSize = pageSize
        self.spill = spill
        track(from: base.size == 0 ? 0 : nil)
    }

    deinit { preparation?.cancel() }

    // MARK: Preparing

    /// A preparation starts once this many bytes were written in order, so that small files
    /// never cost a thread; it is told of all but the last ``preparationLag`` of them, which the
    /// kernel may still write again (a page cache's partly written last page).
    static let preparationStart: Int64 = 8 << 20
    static let preparationLag: Int64 = 1 << 20

    /// Tracks the bytes written in order from `start` (0: the file is empty), or not at all.
    private func track(from start: Int64?) {
        appended = start
        ahead = []
    }

    /// Records a committed write or zeroing of `range` in ``appended``.
    private func recordWritten(_ range: Range<Int64>) {
        guard var end = appended, !range.isEmpty else { return }
        if range.lowerBound > end {
            ahead.append(range)
            if ahead.count > 64 { track(from: nil) }
            return
        }
        end = max(end, range.upperBound)
        ahead.sort { $0.lowerBound < $1.lowerBound }
        while let first = ahead.first, first.lowerBound <= end {
            end = max(end, first.upperBound)
            ahead.removeFirst()
        }
        appended = end
    }

    /// Starts or advances the store's preparation of the bytes written in order, as far as
    /// they are final (under the file system's lock; it never waits). `start` makes one.
    func prepare(_ start: (LiveSource) -> (any ContentsPreparation)?) {
        guard let appended, frozen == 0, propertyList == nil, base.text == nil, base.bytes == nil,
            appended >= Self.preparationStart, !unprepared
        else { return }
        if preparation == nil {
            // Every byte written since the file was empty is in the top layer, unless a save
            // or a failed change started another since: then none is prepared.
            guard let layer = existingTop, !layer.clean, let descriptor = layer.bytes.descriptor,
                layers.count == 1 || layer.cut == 0
            else { return }
            guard let made = start(LiveSource(bytes: layer.bytes, descriptor: descriptor, size: appended))
            else {
                unprepared = true
                return
            }
            preparation = made
            prepared = 0
            preparedLayer = layer
        }
        let final = (appended - Self.preparationLag) / Int64(pageSize) * Int64(pageSize)
        guard final > prepared else { return }
        prepared = final
        preparation?.advance(to: final)
    }

    /// Stops the preparation: bytes it may have read change, or no save will take it.
    func stopPreparation() {
        preparation?.cancel()
        preparation = nil
        prepared = 0
        preparedLayer = nil
    }

    /// Whether anything was written or truncated since the base.
    var isModified: Bool { size != base.size || layers.contains { !$0.clean && !$0.isEmpty } }

    /// The layer ``top`` gives when it gives one that exists: the last, unless frozen or sealed.
    private var existingTop: SpillLayer? {
        guard layers.count > frozen, let last = layers.last, !last.sealed else { return nil }
        return last
    }

    /// The layer that takes a change, made or reopened for it.
    private var top: SpillLayer {
        if let last = existingTop {
            // The last save's clean layer takes the next change itself: a new layer over it
            // would copy in every page a change touches in part, after each save (a program
            // that writes and syncs a little at a time: fsx, databases).
            if last.clean { last.reopen() }
            return last
        }
        let layer = SpillLayer(files: spill)
        layers.append(layer)
        return layer
    }

    /// Where a page's bytes come from, looking through `layers[0..<limit]` then the base.
    enum Source {
        case layer(SpillBytes)
        /// The base, whose bytes past `size` are zeros.
        case base(ContentBase)
        case zero
    }

    func source(of page: Int) -> Source {
        Self.source(of: page, layers: layers[...], base: base, pageSize: pageSize)
    }

    /// The source of a page seen through `layers` (oldest first) over `base`.
    static func source(of page: Int, layers: some Collection<SpillLayer>, base: ContentBase, pageSize: Int)
        -> Source
    {
        let start = Int64(page) * Int64(pageSize)
        for layer in layers.reversed() {
            if layer.contains(page) { return .layer(layer.bytes) }
            if start >= layer.cut { return .zero }
        }
        return start < base.size ? .base(base) : .zero
    }

    /// The same, through frozen layers (a save's).
    static func source(of page: Int, layers: [FrozenLayer], base: ContentBase, pageSize: Int) -> Source {
        let start = Int64(page) * Int64(pageSize)
        for layer in layers.reversed() {
            if layer.contains(page) { return .layer(layer.bytes) }
            if start >= layer.cut { return .zero }
        }
        return start < base.size ? .base(base) : .zero
    }

    /// Pages a write of `count` bytes at `offset` must take in with their old bytes (those it
    /// covers only partly, below the current size).
    func partiallyCoveredPages(offset: Int64, count: Int) -> [Int] {
        guard count > 0 else { return [] }
        let end = offset + Int64(count)
        let cs = Int64(pageSize)
        // Bytes the mount shows but the store does not hold (a property list's text): all of
        // them are taken in, since a save reads what it does not hold from the store.
        if base.text != nil || base.bytes != nil {
            return Array(0..<Int((min(size, base.size) + cs - 1) / cs))
        }
        var result: [Int] = []
        for page in Int(offset / cs)...Int((end - 1) / cs) {
            let pageStart = Int64(page) * cs
            // Old bytes that matter: below the current size and outside the written range.
            let keepEnd = min(pageStart + cs, size)
            let coversAll = offset <= pageStart && end >= keepEnd
            if !coversAll && pageStart < size { result.append(page) }
        }
        return result
    }

    /// The page a truncation to `newSize` cuts in the middle and that must be taken in first.
    func pageCutBy(_ newSize: Int64) -> Int? {
        guard newSize < size, newSize % Int64(pageSize) != 0 else { return nil }
        return Int(newSize / Int64(pageSize))
    }

    // MARK: Changing

    /// A change of the file's bytes (a write, a truncation), planned under the file system's
    /// lock (``planChange(keeping:writing:fetched:)``), its spill I/O run without it
    /// (``copyPages()``, then the change's own writes into ``layer``), and applied under the
    /// lock (``commit(_:)``) only if the file still writes into the same layer.
    ///
    /// Changes of one file run one at a time (``ViewNode/changes``), so only reads and saves run
    /// beside one. A read may see part of a change in progress, as on any file system. A save
    /// waits for a change in progress before it freezes the file (``changing``), so frozen
    /// layers never change and a save may read them twice. A change whose file was replaced
    /// meanwhile (another process's save) is refused at its commit, undone and run again.
    struct ChangePlan: Sendable {
        /// The bytes of the layer the change writes into, which also name the layer.
        let layer: SpillBytes
        let generation: UInt64
        /// Pages new to the layer whose old bytes the change keeps, and where those come from.
        let copies: [(page: Int, from: CopySource)]
        /// Pages new to the layer with no old bytes to keep (covered whole, or past the end).
        let added: [Int]
        /// The bytes the change writes (nil: none; a truncation).
        let range: Range<Int64>?
        let pageSize: Int

        enum CopySource: Sendable {
            /// Nothing: the page reads as zeros.
            case zero
            /// The page as a lower layer holds it. Lower layers take no more writes.
            case layer(SpillBytes)
            /// The page's first bytes, read from the store; the rest are zeros.
            case stored(Data)
        }

        /// Copies the kept bytes of ``copies`` into the layer.
        func copyPages() throws(Errno) {
            var bytes: [UInt8] = []
            for (page, source) in copies {
                let start = Int64(page) * Int64(pageSize)
                switch source {
                case .zero:
                    break
                case .layer(let lower):
                    if bytes.isEmpty { bytes = [UInt8](repeating: 0, count: pageSize) }
                    try withMutableRawBytes(&bytes) { raw throws(Errno) in
                        try lower.read(into: raw, at: start)
                    }
                    try withRawBytes(bytes) { raw throws(Errno) in try layer.write(raw, at: start) }
                    layer.countCopy()
                case .stored(let data):
                    let result = data.withUnsafeBytes { raw in
                        Result { () throws(Errno) in try layer.write(raw, at: start) }
                    }
                    try result.get()
                }
            }
        }

        /// Zeroes what the change may have written outside the layer's pages, when it failed or
        /// its commit was refused; false when that failed too (the layer must take no more writes).
        func undo() -> Bool {
            let pages = copies.map(\.page) + added
            for page in pages {
                do {
                    try layer.zero(at: Int64(page) * Int64(pageSize), length: Int64(pageSize))
                } catch {
                    return false
                }
            }
            return true
        }
    }

    /// The outcome of planning a change.
    enum PlannedChange {
        case ready(ChangePlan)
        /// These pages must first be read from the store, as of these bases.
        case fetch([(page: Int, base: ContentBase)])
    }

    /// Plans a change that keeps the old bytes of the pages `keeping` and writes `range` (nil:
    /// none), given the pages `fetched` from the store so far.
    func planChange(
        keeping: [Int], writing range: Range<Int64>?, truncating newSize: Int64? = nil,
        fetched: [Int: (base: ContentBase, data: Data)]
    ) -> PlannedChange {
        // Before the change's I/O, which a preparation reading those bytes might see.
        if preparation != nil, min(range?.lowerBound ?? .max, newSize ?? .max) < prepared {
            stopPreparation()
        }
        // The layer is made or reopened only once nothing is missing: a plan that must fetch
        // first changes nothing.
        let existing = existingTop
        let cs = Int64(pageSize)
        var copies: [(page: Int, from: ChangePlan.CopySource)] = []
        var missing: [(page: Int, base: ContentBase)] = []
        let kept = Set(keeping)
        for page in kept.sorted() where existing?.contains(page) != true {
            switch source(of: page) {
            case .zero:
                copies.append((page, .zero))
            case .layer(let lower):
                copies.append((page, .layer(lower)))
            case .base(let base):
                guard let got = fetched[page], got.base == base else {
                    missing.append((page, base))
                    continue
                }
                let keep = Int(max(0, min(Int64(got.data.count), base.size - Int64(page) * cs)))
                copies.append((page, .stored(got.data.prefix(keep))))
            }
        }
        if !missing.isEmpty { return .fetch(missing) }
        let layer = top
        // The preparation reads its bytes from one layer: a change that writes into another
        // (after a save froze that one) may be the one to put bytes below them in it.
        if preparation != nil, layer !== preparedLayer { stopPreparation() }
        changing = true
        var added: [Int] = []
        if let range, !range.isEmpty {
            for page in Int(range.lowerBound / cs)...Int((range.upperBound - 1) / cs)
            where !layer.contains(page) && !kept.contains(page) {
                added.append(page)
            }
        }
        return .ready(
            ChangePlan(
                layer: layer.bytes, generation: generation, copies: copies, added: added, range: range,
                pageSize: pageSize))
    }

    /// Marks a planned change's pages as the layer's, if the file still writes into that layer;
    /// false when a save froze it, another process's save replaced the file, or an undo failed
    /// on it since the plan.
    func commit(_ plan: ChangePlan) -> Bool {
        guard plan.generation == generation, layers.count > frozen, let layer = layers.last,
            layer.bytes === plan.layer, !layer.sealed
        else { return false }
        changing = false
        for (page, _) in plan.copies { layer.add(page) }
        for page in plan.added { layer.add(page) }
        if let range = plan.range { layer.markWritten(range, pageSize: pageSize) }
        return true
    }

    /// After a committed write (or zeroing) of `range`.
    func wrote(_ range: Range<Int64>) {
        size = max(size, range.upperBound)
        edits &+= 1
        recordWritten(range)
    }

    /// After a committed change that took in ``pageCutBy(_:)`` and zeroed it past `newSize`:
    /// sets the size. Returns the top layer's pages past the end, no longer in it, whose bytes
    /// must be zeroed before the next change.
    func truncated(to newSize: Int64) -> (layer: SpillBytes, zero: [Range<Int64>]) {
        let layer = top
        var zero: [Range<Int64>] = []
        if newSize < size {
            let cs = Int64(pageSize)
            let firstGone = Int((newSize + cs - 1) / cs)
            for run in layer.removeAll(from: firstGone) {
                zero.append(Int64(run.lowerBound) * cs..<Int64(run.upperBound) * cs)
            }
            layer.cut = min(layer.cut, newSize)
        }
        size = newSize
        edits &+= 1
        if newSize == 0 {
            track(from: 0)
        } else if let end = appended {
            appended = min(end, newSize)
            ahead = ahead.compactMap {
                $0.lowerBound < newSize ? $0.lowerBound..<min($0.upperBound, newSize) : nil
            }
        }
        return (layer.bytes, zero)
    }

    /// A planned change that was not committed has been undone (`undone`), or its undo failed:
    /// then the layer is sealed, since its spill may hold bytes outside its pages.
    func changeAbandoned(_ plan: ChangePlan, undone: Bool) {
        changing = false
        guard let layer = layers.first(where: { $0.bytes === plan.layer }) else { return }
        if !undone { layer.sealed = true }
        // Part of the range may be written into pages the layer held before (undo zeroes only
        // the ones the change brought in): a save compares those bytes again. Only those: a
        // save reads what it compares from the layers.
        guard let range = plan.range, !range.isEmpty, plan.generation == generation else { return }
        let size = Int64(pageSize)
        var page = Int(range.lowerBound / size)
        let last = Int((range.upperBound - 1) / size)
        while page <= last {
            guard layer.contains(page) else {
                page += 1
                continue
            }
            var end = page
            while end < last, layer.contains(end + 1) { end += 1 }
            layer.markWritten(
                max(range.lowerBound, Int64(page) * size)..<min(range.upperBound, Int64(end + 1) * size),
                pageSize: pageSize)
            page = end + 1
        }
    }

    /// Seals a layer whose spill may hold bytes outside its pages.
    func seal(_ bytes: SpillBytes) {
        for layer in layers where layer.bytes === bytes { layer.sealed = true }
    }

    // MARK: Reading

    /// A read as planned under the file system's lock: its length, and the parts that come
    /// from spill layers and from the store (the rest are zeros), to be read without the lock.
    struct ReadPlan: Sendable {
        var count = 0
        var spill: [SpillRead] = []
        var store: [StoreRead] = []

        /// Copies the spill parts into `buffer` (``count`` bytes).
        func readSpill(into buffer: UnsafeMutableRawBufferPointer) throws(Errno) {
            for piece in spill {
                try piece.source.read(
                    into: UnsafeMutableRawBufferPointer(
                        rebasing: buffer[piece.destination..<piece.destination + piece.count]),
                    at: piece.offset)
            }
        }
    }

    /// Plans a read of `[offset, offset+count)`, clipped to the size.
    func planRead(offset: Int64, count: Int) -> ReadPlan {
        Self.plan(offset: offset, count: count, size: size, pageSize: pageSize) { source(of: $0) }
    }

    /// Where the bytes of `[offset, offset+count)`, clipped to `size`, come from.
    static func plan(offset: Int64, count: Int, size: Int64, pageSize: Int, source: (Int) -> Source)
        -> ReadPlan
    {
        var plan = ReadPlan()
        let end = min(offset + Int64(count), size)
        guard end > offset else { return plan }
        plan.count = Int(end - offset)
        let cs = Int64(pageSize)
        var at = offset
        while at < end {
            let page = Int(at / cs)
            let pieceEnd = min(end, Int64(page + 1) * cs)
            let destination = Int(at - offset)
            switch source(page) {
            case .zero:
                break
            case .layer(let layer):
                let length = Int(pieceEnd - at)
                if let last = plan.spill.last, last.source === layer,
                    last.offset + Int64(last.count) == at
                {
                    // One pread for consecutive pages of one layer.
                    plan.spill[plan.spill.count - 1] = SpillRead(
                        source: layer, offset: last.offset, count: last.count + length,
                        destination: last.destination)
                } else {
                    plan.spill.append(
                        SpillRead(source: layer, offset: at, count: length, destination: destination))
                }
            case .base(let base):
                let stored = min(pieceEnd, base.size) - at
                if stored > 0 {
                    if let last = plan.store.last, last.source == base, last.offset + Int64(last.count) == at
                    {
                        // One store read for consecutive pages of the base.
                        plan.store[plan.store.count - 1].count += Int(stored)
                    } else {
                        plan.store.append(
                            StoreRead(source: base, offset: at, count: Int(stored), destination: destination))
                    }
                }
            }
            at = pieceEnd
        }
        return plan
    }

    // MARK: Saving

    /// Runs of pages as byte ranges.
    static func byteRanges(_ runs: [Range<Int>], pageSize: Int) -> [Range<Int64>] {
        let page = Int64(pageSize)
        return runs.map { Int64($0.lowerBound) * page..<Int64($0.upperBound) * page }
    }

    /// What a save of this file sends: the pages to write and how to read them.
    struct Snapshot: Sendable {
        /// The file's ``FileContents/identity``: the save's outcome is the file's only if its
        /// node still has those contents.
        let contents: ContentsIdentity
        let layers: [FrozenLayer]
        let base: ContentBase
        let size: Int64
        let pageSize: Int
        /// The contents' generation when frozen: a reset since (another file's bytes shared
        /// into it, another process's save) makes this save's outcome no longer the file's.
        let generation: UInt64
        /// The store's preparation of the file's bytes, for the save to finish and take.
        let preparation: (any ContentsPreparation)?

        /// The store's chunks (of `chunkSize` bytes) that hold pages written since the base, or
        /// bytes a truncation zeroed below `storedSize` (the size the store has for the node).
        func changedChunks(storedSize: Int64, chunkSize: Int) -> [Int] {
            var ranges: [Range<Int64>] = []
            var lowest = base.size
            // A clean layer's pages are the base's: not changes, and its cut is in the base.
            for layer in layers where !layer.clean {
                ranges += FileContents.byteRanges(layer.pages.runs(), pageSize: pageSize)
                lowest = min(lowest, layer.cut)
            }
            let zeroedEnd = min(size, storedSize)
            if zeroedEnd > lowest { ranges.append(lowest..<zeroedEnd) }
            let cs = Int64(chunkSize)
            var chunks = Set<Int>()
            for range in ranges where range.lowerBound < size {
                let upper = min(range.upperBound, size)
                guard upper > range.lowerBound else { continue }
                for chunk in Int(range.lowerBound / cs)...Int((upper - 1) / cs) { chunks.insert(chunk) }
            }
            return chunks.sorted()
        }

        /// Where the bytes may differ from the base's (``ContentsSource/changedRanges``): what
        /// changes wrote, and what a truncation zeroed below `storedSize`.
        func changedRanges(storedSize: Int64) -> [Range<Int64>] {
            var ranges: [Range<Int64>] = []
            var lowest = base.size
            for layer in layers where !layer.clean {
                ranges += layer.writtenRanges(pageSize: pageSize)
                lowest = min(lowest, layer.cut)
            }
            let zeroedEnd = min(size, storedSize)
            if zeroedEnd > lowest { ranges.append(lowest..<zeroedEnd) }
            return ranges.sorted { $0.lowerBound < $1.lowerBound }
        }

        /// What ``read(offset:count:)`` can read (``ContentsSource/heldRanges``): the layers'
        /// pages, and every page past a truncation or the base's end, which reads as zeros.
        /// The rest is the base's, which the store reads itself.
        var heldRanges: [Range<Int64>] {
            var ranges: [Range<Int64>] = []
            var zeroFrom = base.size
            for layer in layers {
                ranges += FileContents.byteRanges(layer.pages.runs(), pageSize: pageSize)
                zeroFrom = min(zeroFrom, layer.cut)
            }
            let page = Int64(pageSize)
            let from = (zeroFrom + page - 1) / page * page
            if from < size { ranges.append(from..<size) }
            ranges.sort { $0.lowerBound < $1.lowerBound }
            var joined: [Range<Int64>] = []
            for range in ranges {
                if let last = joined.last, range.lowerBound <= last.upperBound {
                    joined[joined.count - 1] = last.lowerBound..<max(last.upperBound, range.upperBound)
                } else {
                    joined.append(range)
                }
            }
            return joined
        }

        /// Reads the frozen state's written and zeroed bytes. Bytes of the base are the store's
        /// own, named by the save (``ContentUpdate/derived(from:size:chunks:source:)``), so a read
        /// that would need them is a bug: it fails rather than call the store during its save.
        func read(offset: Int64, count: Int) throws -> Data {
            let plan = FileContents.plan(offset: offset, count: count, size: size, pageSize: pageSize) {
                page in
                FileContents.source(of: page, layers: layers, base: base, pageSize: pageSize)
            }
            if let piece = plan.store.first {
                throw DocumentStoreError.io(
                    "a save asked for \(piece.count) stored bytes at \(piece.offset) of a file it holds only in part"
                )
            }
            var data = Data(count: plan.count)
            let result = data.withUnsafeMutableBytes { raw in
                Result { () throws(Errno) in try plan.readSpill(into: raw) }
            }
            try result.get()
            return data
        }
    }

    /// Freezes the current layers for a save; later writes go to a new layer.
    func freeze() -> Snapshot {
        frozen = layers.count
        return Snapshot(
            contents: identity, layers: layers.map(\.frozen), base: base, size: size, pageSize: pageSize,
            generation: generation, preparation: preparation)
    }

    /// The save of `snapshot` is in the store as `version` of `node`: the frozen layers go but
    /// the newest, which now holds the base's own bytes for its pages and stays as a clean cache
    /// of them, so that taking them in again or reading them costs a spill read, not a store
    /// read (a file a program keeps open and saves often, as fsx and databases do). `text`: the
    /// file was stored as this compiled property list, and keeps reading as its text.
    func saved(_ snapshot: Snapshot, as node: StoreNodeID, version: VersionID, text: PropertyListText? = nil)
    {
        // Replaced while the save ran (its layers and base are gone): what was saved is an older
        // state, and the file's node is marked changed, so the next save stores the new one.
        guard snapshot.generation == generation else { return }
        let done = min(frozen, layers.count)
        // Its cut stays: pages at or past it that it lacks are zeros in the base too.
        let kept = done > 0 && text == nil && !layers[done - 1].sealed ? layers[done - 1] : nil
        layers.removeFirst(done)
        if let kept {
            kept.clean = true
            layers.insert(kept, at: 0)
        }
        frozen = 0
        // Every save of the file stores the checkpoint or a state that includes it.
        checkpoint = nil
        base = ContentBase(node: node, version: version, size: snapshot.size, text: text)
        // The file has stored bytes now: what follows is an edit of them.
        if snapshot.size > 0 {
            stopPreparation()
            track(from: nil)
        }
    }

    /// Drops the clean cache layer (the file's last handle closed); returns it, to be let go
    /// without the file system's lock, since closing a spill frees its disk blocks.
    func dropClean() -> [SpillLayer] {
        let count = layers.prefix { $0.clean }.count
        guard count > 0 else { return [] }
        let dropped = Array(layers.prefix(count))
        layers.removeFirst(count)
        frozen = max(0, frozen - count)
        return dropped
    }

    /// The save failed: the frozen layers stay, under whatever was written since; a
    /// checkpoint's stay frozen.
    func saveFailed() {
        guard let checkpoint else {
            frozen = 0
            return
        }
        frozen = layers.prefix { layer in checkpoint.layers.contains { $0.bytes === layer.bytes } }.count
    }

    /// Keeps `snapshot`, whose bytes an `fsync` logged, as the file's ``checkpoint``.
    func hold(_ snapshot: Snapshot) {
        guard snapshot.generation == generation else { return }
        checkpoint = snapshot
        saveFailed()
    }

    /// Another process's save replaced the file: start over from the store.
    func reset(to base: ContentBase) {
        layers = []
        frozen = 0
        checkpoint = nil
        self.base = base
        size = base.size
        generation &+= 1
        edits &+= 1
        stopPreparation()
        track(from: base.size == 0 ? 0 : nil)
    }
}

/// The identity of one ``FileContents`` that a value can carry without the view: a reference, so
/// that it stays unique while a snapshot holds it.
final class ContentsIdentity: Sendable {}

/// A range of a read, and where it comes from: a spill layer, or the store at a base.
struct ReadPart<Source: Sendable>: Sendable {
    var source: Source
    var offset: Int64
    var count: Int
    /// Where it goes in the read's buffer.
    var destination: Int
}

typealias SpillRead = ReadPart<SpillBytes>
typealias StoreRead = ReadPart<ContentBase>

/// Reads a frozen file's written pages for the store's streaming save.
struct SnapshotSource: ContentsSource {
    let snapshot: FileContents.Snapshot
    let changedRanges: [Range<Int64>]?
    let heldRanges: [Range<Int64>]?
    var count: Int64 { snapshot.size }
    /// Frozen layers never change: a save waits for a change in progress before it freezes.
    var isStable: Bool { true }
    var preparation: (any ContentsPreparation)? { snapshot.preparation }
    func read(offset: Int64, count: Int) throws -> Data {
        try snapshot.read(offset: offset, count: count)
    }
}

/// Reads the bytes of a new file written in order, for the store's preparation of them
/// (``FileContents/prepare(_:)``): they are all in one spill layer, which stays while this
/// source does, and whose descriptor never changes. Reads take no lock, since the preparation's
/// thread, of the lowest priority, must hold none that requests need; it reads only bytes it
/// was told are final, which no change touches unless it cancels the preparation first.
struct LiveSource: ContentsSource {
    /// Kept so that the descriptor stays open.
    let bytes: SpillBytes
    let descriptor: Int32
    let size: Int64

    var count: Int64 { size }

    func read(offset: Int64, count: Int) throws -> Data {
        var data = Data(count: count)
        let result = data.withUnsafeMutableBytes { raw in
            Result { () throws(Errno) in try SpillBytes.read(descriptor, into: raw, at: offset) }
        }
        if case .failure(let error) = result {
            throw DocumentStoreError.io("a preparation's read of a spill failed: \(error)")
        }
        return data
    }
}

/// `Array.withUnsafeBytes` for bodies with typed throws.
func withRawBytes<T>(_ bytes: [UInt8], _ body: (UnsafeRawBufferPointer) throws(Errno) -> T) throws(Errno) -> T
{
    let result = bytes.withUnsafeBytes { raw in Result { () throws(Errno) -> T in try body(raw) } }
    return try result.get()
}

/// `Array.withUnsafeMutableBytes` for bodies with typed throws.
func withMutableRawBytes<T>(
    _ bytes: inout [UInt8], _ body: (UnsafeMutableRawBufferPointer) throws(Errno) -> T
)
    throws(Errno) -> T
{
    let result = bytes.withUnsafeMutableBytes { raw in Result { () throws(Errno) -> T in try body(raw) } }
    return try result.get()
}
