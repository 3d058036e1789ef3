import DocumentEngine
import Foundation
import Synchronization
import Threading

#if canImport(Glibc)
    import Glibc
#endif

extension VersionedStore {
    /// A preparation that cuts and hashes the file's final bytes in order
    /// (``PreparedContents``); nil for a store whose chunks are too small to cut by content.
    public func prepareContents(reading source: any ContentsSource) -> (any ContentsPreparation)? {
        guard case .contentDefined(let chunker) = chunking.large else { return nil }
        return PreparedContents(store: self, source: source, chunker: chunker)
    }

    /// Runs preparations at normal priority from now on: for tests, which keep a machine's cores
    /// so busy that a low-priority thread may wait seconds for one.
    package static func preparesAtNormalPriority() { PreparedContents.niceness.store(0, ordering: .relaxed) }

    /// The precut of `update` (`size` bytes read from `source`) that its source's preparation
    /// gives, finished here; outside any write transaction.
    func finishPreparation(of update: ContentUpdate, size: Int64, source: any ContentsSource) throws
        -> Precut?
    {
        try preparation(of: update)?.finish(size: size, source: source)
    }

    /// The precut of `update` that its source's finished preparation gives, inside a write
    /// transaction, where finishing one would store its chunks' batches in transactions of
    /// their own, which wait for this one. An unfinished or unusable one is cancelled.
    func finishedPreparation(of update: ContentUpdate) -> Precut? {
        guard let prepared = preparation(of: update) else { return nil }
        guard let (size, _) = precutSource(update) else {
            prepared.cancel()
            return nil
        }
        return prepared.finished(size: size)
    }

    /// The preparation `update`'s source carries, if this store made it; another's is cancelled.
    private func preparation(of update: ContentUpdate) -> PreparedContents? {
        guard let preparation = update.source?.preparation else { return nil }
        guard let prepared = preparation as? PreparedContents, prepared.store === self else {
            preparation.cancel()
            return nil
        }
        return prepared
    }
}

/// A new file's bytes cut into chunks and hashed while it is being written, for the save that
/// takes them (a ``Precut`` of the whole file).
///
/// A large file written in one go (a copy, an export, a download) used to be cut and hashed
/// only when it was saved, after its last byte: at an `fsync` that then took longer than all
/// the writes before it. Here the bytes the writer says are final (``advance(to:)``) are read
/// back while the next ones are written, and their chunks are cut as soon as a maximum chunk's
/// bytes follow them, since no later byte moves such a cut (``ContentDefinedChunker``). The
/// save finishes the rest (``finish(size:source:)``) from its own source, whose bytes below
/// those advanced to are the ones read here unless the writer cancelled.
///
/// The reading, cutting and hashing run on a thread of the preparation's own at the lowest
/// priority (nice 19), so they take little CPU that something else wants: at normal priority,
/// on a machine of two cores, they slowed the writes themselves as much as they shortened the
/// `fsync`. A thread of such priority may wait long for a core when others keep them busy, so
/// it shares no lock with the writer's side (``advance(to:)`` and ``cancel()`` are atomic, and
/// the source reads a file without the file system's lock), and nothing of normal priority
/// waits for it to get on: each chunk is published when it is hashed, and a save takes the
/// chunks published so far and cuts the rest itself, while the thread, at its next chunk,
/// finds it finishing and stops.
///
/// It keeps only each chunk's length and hash, and stores nothing: storing them while the file
/// was written, at normal priority (the store's write lock must never be held at low priority),
/// made the writes a tenth slower on two cores, for little. The save stores them (a precut's
/// batches, outside its transaction, ``PrecutBuilder``), reading from its own source the bytes
/// of those the store lacks, while it cuts the rest.
final class PreparedContents: ContentsPreparation, Sendable {
    let store: VersionedStore
    private let chunker: ContentDefinedChunker

    // What the writer's side touches, without a lock: it calls in under a file system's lock,
    // which must never wait for the preparation's thread.
    /// The bytes the writer said are final.
    private let final = Atomic<Int64>(0)
    /// A step is queued or running; while it is, only it uses the step's fields below.
    private let stepping = Atomic(false)
    private let cancelled = Atomic(false)
    /// A save took the chunks: no more are published, and no step starts.
    private let finishing = Atomic(false)
    /// The thread was started; it waits for this between steps.
    private let started = Atomic(false)
    private let wake = WakeSignal()

    private struct Shared {
        var source: (any ContentsSource)?
        /// The chunks published, from offset 0 to `cut`.
        var pieces: [Precut.Piece] = []
        var cut: Int64 = 0
        /// What the finish gave.
        var result: Precut?

        mutating func drop() {
            source = nil
            pieces = []
            cut = 0
        }
    }
    private let shared = Mutex(Shared())
    /// One finish at a time (a save tried again runs after the first).
    private let finishes = OrderedLock(.preparationFinish)

    /// The step's own, one step at a time: bytes read but not yet cut, from `buffer[start...]`.
    /// Only the preparation's thread takes this lock.
    private struct Step {
        var buffer: [UInt8] = []
        var start = 0
    }
    private let step = Mutex(Step())
    /// Bytes read by steps (read by others only to decide whether a step is due).
    private let read = Atomic<Int64>(0)

    /// A step starts once this many final bytes wait, reads this many at a time, and reads at
    /// most `stepBytes` before it lets other preparations' steps run.
    static let step: Int64 = 4 << 20
    static let readSize = 1 << 20
    static let stepBytes: Int64 = 32 << 20
    /// The nice value of the preparations' threads: the lowest priority, or for tests, whose
    /// machine is busy with other tests, a normal one.
    static let niceness = Atomic<Int32>(19)

    init(store: VersionedStore, source: any ContentsSource, chunker: ContentDefinedChunker) {
        self.store = store
        self.chunker = chunker
        shared.withLock { $0.source = source }
    }

    private var isStopped: Bool {
        cancelled.load(ordering: .acquiring) || finishing.load(ordering: .acquiring)
    }

    /// Whether enough final bytes wait for a step.
    private var stepIsDue: Bool {
        !isStopped && final.load(ordering: .acquiring) - read.load(ordering: .acquiring) >= Self.step
    }

    /// Wakes the thread for a step unless one is due or running; starts the thread first.
    private func startStep() {
        guard stepIsDue,
            stepping.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing)
                .exchanged
        else { return }
        if started.compareExchange(expected: false, desired: true, ordering: .acquiringAndReleasing).exchanged
        {
            startDetachedThread(name: "docfs-prepare") { [self] in run() }
        }
        wake.signal()
    }

    /// The thread: a step each time it is woken, until the preparation stops.
    private func run() {
        #if os(Linux)
            // The calling thread only, on Linux.
            _ = setpriority(
                __priority_which_t(PRIO_PROCESS.rawValue), 0, Self.niceness.load(ordering: .relaxed))
        #endif
        while true {
            wake.wait()
            if isStopped { break }
            work()
        }
        if cancelled.load(ordering: .acquiring) { shared.withLock { $0.drop() } }
        step.withLock { $0 = Step() }
    }

    func advance(to count: Int64) {
        guard !isStopped else { return }
        var current = final.load(ordering: .relaxed)
        while count > current {
            let (exchanged, original) = final.compareExchange(
                expected: current, desired: count, ordering: .acquiringAndReleasing)
            if exchanged { break }
            current = original
        }
        startStep()
    }

    /// Never waits: the thread stops at its next chunk, or when it wakes.
    func cancel() {
        cancelled.store(true, ordering: .releasing)
        if started.load(ordering: .acquiring) { wake.signal() }
    }

    func finish(reading source: any ContentsSource) throws {
        _ = try finish(size: source.count, source: source)
    }

    /// One step: reads and cuts final bytes, up to ``stepBytes`` of them, then wakes the thread
    /// again while there are enough more.
    private func work() {
        let source = shared.withLock { $0.source }
        if !isStopped, let source {
            let target = min(final.load(ordering: .acquiring), read.load(ordering: .relaxed) + Self.stepBytes)
            let before = read.load(ordering: .relaxed)
            if !take(upTo: target, from: source), !finishing.load(ordering: .acquiring) {
                cancel()
            }
            store.countPrepared(read.load(ordering: .relaxed) - before)
        }
        stepping.store(false, ordering: .releasing)
        // Bytes made final while this step ran, which saw it running and left them to it.
        startStep()
    }

    /// Reads the bytes up to `target`, cuts every chunk they decide, hashes it and publishes
    /// it; false when the source failed, or the preparation was cancelled or is finishing.
    private func take(upTo target: Int64, from source: any ContentsSource) -> Bool {
        let maximum = chunker.maximumSize
        return step.withLock { step -> Bool in
            var at = read.load(ordering: .relaxed)
            while at < target {
                let count = Int(min(Int64(Self.readSize), target - at))
                guard let data = try? source.read(offset: at, count: count), data.count == count else {
                    return false
                }
                if step.start >= maximum {
                    step.buffer.removeFirst(step.start)
                    step.start = 0
                }
                step.buffer.append(contentsOf: data)
                at += Int64(count)
                read.store(at, ordering: .releasing)
                // A cut with a maximum chunk of bytes after it is final: bytes past those never
                // move it. The rest waits for more bytes, or for the save.
                while step.buffer.count - step.start >= maximum {
                    // Hashed where it lies: nothing keeps the chunk's bytes but the save's source.
                    let start = step.start
                    let (length, hash) = step.buffer.withUnsafeBytes { raw -> (Int, Data?) in
                        let rest = UnsafeRawBufferPointer(rebasing: raw[start...])
                        let length = chunker.cut(rest)
                        let chunk = UnsafeRawBufferPointer(rebasing: rest[..<length])
                        return (length, VersionedStore.isZero(chunk) ? nil : VersionedStore.hash(chunk))
                    }
                    step.start += length
                    guard publish(Precut.Piece(length: length, hash: hash)) else { return false }
                }
            }
            return true
        }
    }

    /// Adds a hashed chunk to those published; false when the preparation was cancelled or is
    /// finishing.
    private func publish(_ piece: Precut.Piece) -> Bool {
        shared.withLock { shared in
            // Under the lock, which a finish takes after it says it is finishing: once the
            // finish took the chunks, none is added.
            guard !isStopped else { return false }
            shared.pieces.append(piece)
            shared.cut += Int64(piece.length)
            return true
        }
    }

    /// The precut of a file of `size` bytes: the chunks published, stored now from `source`,
    /// and the rest read from it and cut, hashed and stored, at the caller's priority. Nil when
    /// cancelled, or when the file is not what was prepared (shorter than what was cut, or cut
    /// otherwise for its size). Outside any write transaction: batches are stored in transactions of
    /// their own. Never waits for the preparation's thread.
    func finish(size: Int64, source: any ContentsSource) throws -> Precut? {
        finishes.lock()
        defer { finishes.unlock() }
        finishing.store(true, ordering: .releasing)
        let taken = shared.withLock { shared -> Shared in
            defer { shared.drop() }
            return shared
        }
        if let result = taken.result { return result.size == size ? result : nil }
        guard !cancelled.load(ordering: .acquiring), size >= taken.cut,
            case .contentDefined(let method) = store.chunking.method(forSize: size), method == chunker
        else { return nil }
        let precut: Precut
        do {
            let builder = PrecutBuilder(store: store)
            builder.take(taken.pieces, from: source)
            precut = try builder.cut(
                size: size, source: source, page: Int64(store.chunkSize), from: taken.cut)
        } catch {
            // The chunks it took are gone with it: a save tried again cuts the file itself.
            cancel()
            throw error
        }
        shared.withLock { $0.result = precut }
        if started.load(ordering: .acquiring) { wake.signal() }
        return precut
    }

    /// The finished precut for a file of `size` bytes, without finishing it: inside a write
    /// transaction (``VersionedStore/finishedPreparation(of:)``). An unfinished preparation is
    /// cancelled.
    func finished(size: Int64) -> Precut? {
        if let result = shared.withLock({ $0.result }), result.size == size { return result }
        cancel()
        return nil
    }
}
