import DocumentEngine
import Foundation

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

    /// Stops listening; the thread closes its connection and ends within a fraction of a second.
    func stop() {
        state.condition.lock()
        state.stopped = true
        state.condition.broadcast()
        state.condition.unlock()
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

    /// Listens until the connection fails or the listener stops; closes the connection.
    private static func listen(on connection: PostgresConnection, database: PostgresDatabase, state: State) {
        defer { connection.close() }
        let session = SQLConnection(connection: connection, timeout: database.timeout)
        guard !isStopped(state), (try? session.query("LISTEN \(PostgresSchema.channel)")) != nil else {
            return
        }
        bump(state)
        let tick: Duration = .milliseconds(250)
        var lastHeard = ContinuousClock.now
        while !isStopped(state) {
            do {
                if try connection.awaitInput(until: .now + tick) { lastHeard = .now }
            } catch {
                return
            }
            if connection.takeNotifications() > 0 { bump(state) }
            if ContinuousClock.now - lastHeard >= heartbeat {
                guard (try? session.query("SELECT 1")) != nil else { return }
                lastHeard = .now
                if connection.takeNotifications() > 0 { bump(state) }
            }
        }
    }
}
