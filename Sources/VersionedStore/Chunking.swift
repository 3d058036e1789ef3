import Foundation

/// The store's way of cutting contents: content-defined, or fixed-size where the chunk size is
/// too small for content-defined chunks.
struct Chunking: Sendable {
    enum Method: Sendable {
        case contentDefined(ContentDefinedChunker)
        case fixed(Int)
    }
    let method: Method
    private var stream: ContentDefinedChunker.Stream?
    private(set) var offset: Int64
    private var pending = Data()

    init(_ method: Method, startingAt offset: Int64) {
        self.method = method
        self.offset = offset
        if case .contentDefined(let chunker) = method {
            stream = ContentDefinedChunker.Stream(chunker, startingAt: Int(offset))
        }
    }

    /// How a store cuts files: by the file's size, so a small file's edit stores a few KiB, not
    /// about a large chunk.
    ///
    /// An edit stores the one to three chunks around it. With one cut for every file that was
    /// about 200 KB for an edit of a file under 256 KiB (xfstests' fsx: one `msync` a save, 257 MB
    /// of chunks in 20,000 operations); small files now cut eight times finer. Files at most
    /// ``smallFileLimit`` long use ``small``, longer ones ``large``: the class is the new
    /// size's, so identical files always cut alike. A file that changes class keeps the extents
    /// it has; windows of new cuts end where a new cut meets an old boundary, as always, so
    /// contents stay right and only the edit's neighbourhood is cut again.
    struct Policy: Sendable {
        let large: Method
        let small: Method
        /// The longest file cut with ``small``: one chunk size (256 KiB by default), the files a
        /// large cut gives one to three chunks. Not more: a 1 MB image cut small took 55 chunks
        /// instead of 7, and its save wrote a fifth more to SQLite's log.
        let smallFileLimit: Int64

        init(chunkSize: Int) {
            large = Chunking.method(chunkSize: chunkSize)
            // A store whose chunks are too small to cut by content eighths has one class.
            let eighths = Chunking.method(chunkSize: chunkSize / 8)
            if case .contentDefined = eighths { small = eighths } else { small = large }
            smallFileLimit = Int64(chunkSize)
        }

        func method(forSize size: Int64) -> Method { size <= smallFileLimit ? small : large }
    }

    /// The chunking for chunks of at most `chunkSize` bytes: content-defined with a normal size
    /// of half that and a minimum of an eighth (32, 128 and 256 KiB by default; 4, 16 and 32 KiB
    /// for small files), fixed-size below 128 bytes. Half, not a quarter: every chunk costs a row,
    /// an index entry and a part-filled page, and an edit still costs about one chunk.
    static func method(chunkSize: Int) -> Method {
        let maximum = min(chunkSize, ContentDefinedChunker.largestMaximumSize)
        var average = 1
        while average * 2 <= maximum / 2 { average *= 2 }
        if let chunker = try? ContentDefinedChunker(
            minimumSize: max(1, average / 4), averageSize: average, maximumSize: maximum)
        {
            return .contentDefined(chunker)
        }
        return .fixed(chunkSize)
    }

    /// The next chunk's bytes, reading through `read` (up to the count asked, at least one byte
    /// until the end, then empty).
    mutating func next(read: (Int) throws -> Data) throws -> Data? {
        switch method {
        case .contentDefined:
            guard var stream else { return nil }
            // Taken out while it runs: a second reference to its buffer would make every
            // append copy the whole buffer.
            self.stream = nil
            defer { self.stream = stream }
            let chunk = try stream.next(read: read)
            offset = Int64(stream.offset)
            return chunk
        case .fixed(let size):
            var data = try read(size)
            while !data.isEmpty && data.count < size {
                let more = try read(size - data.count)
                if more.isEmpty { break }
                data.append(more)
            }
            if data.isEmpty { return nil }
            offset += Int64(data.count)
            return data
        }
    }
}
