import DocumentEngine
import Foundation
import PostgresNIO

/// Listens on the store's notification channel on a connection of its own, from a dedicated
/// thread that reconnects when the connection is lost, and counts notifications.
///
/// Every (re)connection also counts as a change: notifications sent while nobody listened are
/// lost, so observers must look at the event log again.
final class ChangeListener: Sendable {
    private final class State: @unchecked Sendable {
        // Guarded by `condition`.
        var generation: UInt64 = 0
        var started = false
        var stopped = false
        var connection: PostgresConnection?
        let condition = NSCondition()
    }

    private let database: PostgresDatabase
    private let state = State()
    /// How often an idle listening connection is checked: a server that vanished without closing
    /// the connection (a machine gone, a paused process) is noticed within this time.
    private static let heartbeat: Duration = .seconds(5)

    init(database: PostgresDatabase) { self.database = database }

    /// Starts listening unless it is already; returns the current generation.
    @discardableResult
    func start() -> UInt64 {
        state.condition.lock()
        defer { state.condition.unlock() }
        if !state.started && !state.stopped {
            state.started = true
            let thread = Thread { [database, state] in Self.run(database: database, state: state) }
            thread.name = "docfs.postgres-listener"
            thread.start()
        }
        return state.generation
    }

    /// Stops listening and closes the connection; the thread ends within a fraction of a second.
    func stop() {
        state.condition.lock()
        state.stopped = true
        let connection = state.connection
        state.connection = nil
        state.condition.broadcast()
        state.condition.unlock()
        connection?.closeSoon()
    }

    func wait(after generation: UInt64, timeout: Duration) -> UInt64 {
        start()
        let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
        let deadline = Date(timeIntervalSinceNow: seconds)
        state.condition.lock()
        defer { state.condition.unlock() }
        while state.generation <= generation && !state.stopped {
            if !state.condition.wait(until: deadline) { break }
        }
        return state.generation
    }

    private static func bump(_ state: State) {
        state.condition.lock()
        state.generation &+= 1
        state.condition.broadcast()
        state.condition.unlock()
    }

    private static func isStopped(_ state: State) -> Bool {
        state.condition.lock()
        defer { state.condition.unlock() }
        return state.stopped
    }

    private static func run(database: PostgresDatabase, state: State) {
        while !isStopped(state) {
            if let connection = try? database.connect() {
                listen(on: connection, database: database, state: state)
            }
            bump(state)
            // Bounded retry: the server may be restarting.
            if !isStopped(state) { Thread.sleep(forTimeInterval: 0.5) }
        }
    }

    /// Listens until the connection fails or the listener stops.
    private static func listen(on connection: PostgresConnection, database: PostgresDatabase, state: State) {
        let closed = DispatchSemaphore(value: 0)
        connection.closeFuture.whenComplete { _ in closed.signal() }
        connection.addListener(channel: PostgresSchema.channel) { _, _ in bump(state) }
        let session = SQLConnection(
            connection: connection, logger: database.logger, timeout: database.timeout,
            location: database.location)
        state.condition.lock()
        let stopped = state.stopped
        if !stopped { state.connection = connection }
        state.condition.unlock()
        // Statements run in order on a connection: once this returns, LISTEN has been executed.
        guard !stopped, (try? session.query("SELECT 1")) != nil else {
            connection.closeSoon()
            return
        }
        bump(state)
        var sinceCheck: Duration = .zero
        let tick: Duration = .milliseconds(250)
        while !isStopped(state) {
            if closed.wait(timeout: .now() + 0.25) == .success { break }
            sinceCheck += tick
            if sinceCheck >= heartbeat {
                sinceCheck = .zero
                if (try? session.query("SELECT 1")) == nil { break }
            }
        }
        connection.closeSoon()
        state.condition.lock()
        if state.connection === connection { state.connection = nil }
        state.condition.unlock()
    }
}
